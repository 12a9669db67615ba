"""Launching a data-parallel job: one process per local device, several machines, torchrun.

:func:`launch` (``ooc train ... --devices N``) starts one process per local device with the
environment ``torchrun`` would give it (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), so a worker started by ooc
and one started by ``torchrun`` run the same code (:func:`ooc.distributed.context.init_from_env`).
Several machines run the same command with ``--nnodes M --node-rank R --master-addr HOST
--master-port PORT``; each reads its own copy of the dataset (the path given on that machine).

Failure handling.  A rank that stops answering makes the others raise within ``--dist-timeout``; a
rank that dies closes its sockets, so the others fail at their next collective, usually at once.
The launcher watches its children and, when one exits non-zero, terminates the other local ranks
and exits non-zero; children die with their launcher (``PR_SET_PDEATHSIG``).  The initial
rendezvous waits ``--dist-init-timeout`` (default 600 s: machines may start minutes apart).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, NoReturn

import torch

from ooc.distributed.context import (DEFAULT_INIT_TIMEOUT_S, DEFAULT_TIMEOUT_S, init_from_env,
                                     torchrun_env_present)

__all__ = ["LaunchSpec", "parse_devices", "free_port", "launch", "launch_spec_from_args",
           "train_worker", "run_cli"]

log = logging.getLogger("ooc.distributed")


def parse_devices(spec: str | int | None) -> list[str]:
    """Local devices of ``--devices``: ``N`` (the first N CUDA devices, or N CPU processes when
    there is no CUDA), ``cuda`` (every CUDA device), or a comma list such as ``cuda:0,cuda:1`` or
    ``cpu,cpu``.

    Raises:
        ValueError: a malformed entry, N < 1, or more CUDA devices than the machine has.
    """
    if spec is None or str(spec).strip() == "":
        return []
    text = str(spec).strip()
    ncuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if text.isdigit():
        n = int(text)
        if n < 1:
            raise ValueError(f"--devices {text}: need at least one device")
        if ncuda == 0:
            return ["cpu"] * n
        if n > ncuda:
            raise ValueError(f"--devices {n}: only {ncuda} CUDA devices on this machine")
        return [f"cuda:{i}" for i in range(n)]
    if text == "cuda":
        if ncuda == 0:
            raise ValueError("--devices cuda: CUDA is not available")
        return [f"cuda:{i}" for i in range(ncuda)]
    out = []
    for item in text.split(","):
        item = item.strip()
        try:
            dev = torch.device(item)
        except RuntimeError:
            raise ValueError(f"--devices: {item!r} is not a device (cpu, cuda:0, ...)") from None
        if dev.type == "cuda":
            idx = 0 if dev.index is None else dev.index
            if idx >= ncuda:
                raise ValueError(f"--devices: {item} requested but this machine has {ncuda} CUDA "
                                 "devices")
            out.append(f"cuda:{idx}")
        elif dev.type == "cpu":
            out.append("cpu")
        else:
            raise ValueError(f"--devices: device type {dev.type!r} is not supported")
    cuda = [d for d in out if d != "cpu"]
    if len(set(cuda)) != len(cuda):
        raise ValueError(f"--devices {text}: a CUDA device is listed twice")
    if cuda and len(cuda) != len(out):
        raise ValueError(f"--devices {text}: mixing CPU and CUDA ranks is not supported")
    return out


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# ====================================================================== launching
@dataclass
class LaunchSpec:
    """What one machine's launcher needs.

    Attributes:
        devices: local devices, one process each (``parse_devices``).
        nnodes, node_rank: machines in the job and this machine's index (0 hosts the rendezvous).
        master_addr, master_port: the rendezvous (node 0's address; port 0 = pick a free one,
            single machine only).
        timeout_s: collective timeout; init_timeout_s: rendezvous timeout.
        backend: ``nccl`` / ``gloo``, or None for NCCL on CUDA and gloo on CPU.
    """

    devices: list[str]
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    timeout_s: float = DEFAULT_TIMEOUT_S
    init_timeout_s: float = DEFAULT_INIT_TIMEOUT_S
    backend: str | None = None

    @property
    def local_world(self) -> int:
        return len(self.devices)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.local_world

    def validate(self) -> None:
        """Raise ValueError on an impossible layout."""
        if not self.devices:
            raise ValueError("no devices to launch on")
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank {self.node_rank} outside [0, --nnodes {self.nnodes})")
        if self.nnodes > 1 and not self.master_port:
            raise ValueError("--nnodes > 1 needs --master-addr and --master-port (the same on every "
                             "machine)")
        if self.timeout_s <= 0 or self.init_timeout_s <= 0:
            raise ValueError("timeouts must be positive")

    def env(self, local_rank: int) -> dict[str, str]:
        """The environment of local rank ``local_rank`` (torchrun's variables plus ooc's)."""
        threads = max(1, (os.cpu_count() or 1) // self.local_world)
        env = {
            "RANK": str(self.node_rank * self.local_world + local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world),
            "GROUP_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "OOC_DEVICE": self.devices[local_rank],
            "OOC_DIST_TIMEOUT": str(self.timeout_s),
            "OOC_DIST_INIT_TIMEOUT": str(self.init_timeout_s),
        }
        if self.backend:
            env["OOC_DIST_BACKEND"] = self.backend
        for k in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "MKL_NUM_THREADS"):
            if k not in os.environ:  # share the cores between the local ranks
                env[k] = str(threads)
        return env


def _set_pdeathsig() -> None:
    """Ask Linux to SIGKILL this process when its parent (the launcher) dies."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:  # pragma: no cover
        pass


_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Timed out", "timed out",
              "Broken pipe", "NCCL communicator was aborted", "shared buffer:")


def _entry(fn: Callable[..., Any], args: tuple, env: dict[str, str]) -> None:
    """Body of a spawned rank: apply its environment, run ``fn(*args)``, exit 0, 2 (a bad option,
    input or state: its one-line message printed) or 1 (anything else, with its traceback)."""
    _set_pdeathsig()
    os.environ.update(env)
    rank = env.get("RANK", "?")
    try:
        fn(*args)
    except BaseException as e:  # noqa: BLE001 -- reported, then the process ends non-zero
        user = _is_user_error(e)
        if not user:  # a bug: the traceback helps; a bad option or input: the message
            traceback.print_exc()
        msg = f"{type(e).__name__}: {e}"
        if any(t in str(e) for t in _PEER_LOST):
            msg = f"lost contact with another rank (it died or stopped answering): {msg}"
        print(f"ooc: rank {rank} failed: {msg}", file=sys.stderr, flush=True)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(2 if user else 1)  # do not wait for threads blocked in I/O or collectives
    _exit_success()


def _exit_success() -> NoReturn:
    """End a rank whose work succeeded: run the ``atexit`` handlers (logging's flush among them),
    flush the standard streams and leave with status 0 through ``os._exit``.

    A normal interpreter exit also runs the C++ static destructors of the libraries a rank loaded,
    and one of them (a worker thread of a process group or thread pool still joinable at that point)
    can call ``std::terminate`` -- "terminate called without an active exception", SIGABRT -- after
    every file of the run was written.  Nothing the rank needs happens in that teardown: its files
    are closed by the training loop, its shared-memory segments are unlinked as soon as every rank
    has mapped them (:mod:`ooc.data.shared`), and a rank starts no child process.
    """
    import atexit
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _is_user_error(e: BaseException) -> bool:
    """Errors that name a bad option, input or state (reported as one line, as ``ooc`` does)."""
    from ooc.storage.dataset import DatasetError
    return isinstance(e, (ValueError, FileNotFoundError, FileExistsError, DatasetError)) or \
        type(e).__name__ in ("LockError", "CheckpointError")


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def launch(fn: Callable[..., Any], args: tuple, spec: LaunchSpec, grace_s: float = 5.0,
           timeout_s: float | None = None) -> int:
    """Run ``fn(*args)`` in one spawned process per local device and wait for all of them.

    Each process gets :meth:`LaunchSpec.env` (torchrun's variables) and calls :func:`init_from_env`
    itself.  When a process exits non-zero, the other local ranks are terminated (SIGTERM, then
    SIGKILL after ``grace_s``) and an error naming the rank is printed.  ``fn`` must be importable
    by name (a module-level function): the processes are spawned, not forked.

    Args:
        timeout_s: stop everything and fail after this many seconds (None: no limit; for tests).

    Returns:
        0 if every local rank succeeded; 2 if the first rank to fail failed on a bad option, input
        or state (as ``ooc`` exits on one), 1 if it failed otherwise; 124 on ``timeout_s``.

    Raises:
        ValueError: an invalid spec.
    """
    import multiprocessing as mp
    from multiprocessing.connection import wait

    spec.validate()
    if not spec.master_port:
        spec.master_port = free_port(spec.master_addr)
    ctx = mp.get_context("spawn")
    procs: dict[int, Any] = {}
    saved = dict(os.environ)
    try:
        for lr in range(spec.local_world):
            env = spec.env(lr)
            os.environ.update(env)  # spawned children inherit the environment at start
            p = ctx.Process(target=_entry, args=(fn, args, env), name=f"ooc-rank{env['RANK']}")
            p.start()
            procs[int(env["RANK"])] = p
            log.info("rank %s: pid %d on %s", env["RANK"], p.pid, env["OOC_DEVICE"])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    failed: tuple[int, int | None] | None = None
    alive = dict(procs)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while alive:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                failed = (-2, None)
                break
            ready = wait([p.sentinel for p in alive.values()], timeout=left)
            for rank, p in list(alive.items()):
                if p.sentinel in ready:
                    p.join()
                    del alive[rank]
                    if p.exitcode != 0 and failed is None:
                        failed = (rank, p.exitcode)
            if failed is not None:
                break
    except KeyboardInterrupt:
        failed = (-1, None)
    if failed is not None:
        rank, code = failed
        if rank >= 0:
            print(f"ooc: rank {rank} (pid {procs[rank].pid}) {_describe_exit(code)}; stopping the "
                  f"{len(alive)} other local rank(s)", file=sys.stderr, flush=True)
        elif rank == -2:
            print(f"ooc: the job did not finish within {timeout_s:.0f} s; stopping "
                  f"{len(alive)} local rank(s)", file=sys.stderr, flush=True)
        for p in alive.values():
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + grace_s
        for p in alive.values():
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
        return 124 if failed[0] == -2 else 2 if failed[1] == 2 else 1
    return 0


def launch_spec_from_args(args: Any, cfg: Any = None) -> "LaunchSpec | str | None":
    """What ``ooc train`` should do with the data-parallel flags of ``args``:

    - ``"torchrun"``: this process is one rank of a job (torchrun's variables with ``WORLD_SIZE``
      > 1); ``--devices``, if given, picks this rank's device by ``LOCAL_RANK``;
    - a :class:`LaunchSpec`: ``--devices`` / ``--nnodes`` ask for more than one process;
    - None: train in this process (``--devices`` naming one device sets ``cfg.device``).

    Raises:
        ValueError: bad ``--devices`` or node layout.
    """
    devices = getattr(args, "devices", None)
    nnodes = int(getattr(args, "nnodes", 1) or 1)
    if torchrun_env_present() and int(os.environ["WORLD_SIZE"]) > 1:
        if devices:
            local = parse_devices(devices)
            lr = int(os.environ["LOCAL_RANK"])
            if lr >= len(local):
                raise ValueError(f"--devices {devices}: no device for LOCAL_RANK {lr}")
            os.environ["OOC_DEVICE"] = local[lr]
        return "torchrun"
    if not devices and nnodes == 1:
        return None
    spec = LaunchSpec(parse_devices(devices or "1"), nnodes, int(getattr(args, "node_rank", 0)),
                      getattr(args, "master_addr", "127.0.0.1"), int(getattr(args, "master_port", 0)),
                      float(getattr(args, "dist_timeout", DEFAULT_TIMEOUT_S)),
                      float(getattr(args, "dist_init_timeout", DEFAULT_INIT_TIMEOUT_S)),
                      getattr(args, "dist_backend", None))
    spec.validate()
    if spec.world_size == 1:
        if cfg is not None:
            cfg.device = spec.devices[0]
        return None
    return spec


def train_worker(cfg_dict: dict, resume: bool, control: dict | None = None) -> None:
    """One rank of ``ooc train --devices ...`` (or of a torchrun job): join, train, leave.

    Args:
        cfg_dict: the run's configuration (:meth:`TrainConfig.to_dict`).
        resume: continue the run's checkpoint.
        control: the run-control flags (``--overwrite`` / ``--wait``, not configuration fields:
            :func:`ooc.training.rundir.run_control`); None: neither.
    """
    import logging as _logging

    from ooc.config import TrainConfig
    from ooc.training.loop import train
    from ooc.training.rundir import set_run_control
    if not _logging.getLogger().handlers:  # a spawned rank: warnings worded as ooc train's own
        from ooc.util.logs import PlainFormatter
        handler = _logging.StreamHandler()
        handler.setFormatter(PlainFormatter(f"ooc train: rank {os.environ.get('RANK', '?')}"))
        _logging.basicConfig(level=_logging.WARNING, handlers=[handler])
    import threading

    from tqdm import tqdm
    tqdm.set_lock(threading.RLock())  # not tqdm's default multiprocessing lock: a killed rank leaks none
    ctx = init_from_env()
    try:
        cfg = TrainConfig().update(cfg_dict, source="launcher")
        if control:
            set_run_control(cfg, **control)
        cfg.progress = cfg.progress and ctx.is_main
        train(cfg, resume=resume, job=ctx)
    finally:
        ctx.close()


def run_cli(cfg: Any, resume: bool, spec: LaunchSpec | None) -> int:
    """``ooc train`` with ``--devices`` / ``--nnodes`` (``spec``): launch the ranks and return the
    exit status; inside a torchrun job (``spec`` None) this process is the rank: train, then leave
    with status 0 through :func:`_exit_success` (this call does not return), or raise."""
    from ooc.training.rundir import run_control
    if spec is None:
        train_worker(cfg.to_dict(), resume, run_control(cfg))
        _exit_success()
    from pathlib import Path
    out = Path(cfg.output_dir)
    existed = out.exists()
    rc = launch(train_worker, (cfg.to_dict(), resume, run_control(cfg)), spec)
    if rc != 0 and not existed and out.is_dir() and not (out / "metrics.jsonl").exists():
        import shutil  # set-up failed on this machine: leave no half-made run folder
        shutil.rmtree(out, ignore_errors=True)
    return rc
