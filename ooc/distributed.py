"""Data-parallel training: one process per device, several machines, one code path (issue 7).

Launch (:func:`launch`, ``ooc train ... --devices N``) starts one process per local device with the
environment ``torchrun`` would give it (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), so a worker started by ooc
and one started by ``torchrun`` run the same code (:func:`init_from_env`).  Several machines run the
same command with ``--nnodes M --node-rank R --master-addr HOST --master-port PORT``; each reads its
own copy of the dataset (the path given on that machine).

Sharding (:func:`shard_plan`).  All ranks build the *same* global epoch plan with batch size
``world * B`` (partition-ordered and shuffled by (seed, epoch), as a single process would) and rank
``r`` trains on the ``r``-th of ``world`` near-equal contiguous slices of each global batch.  The
sampler's draws are keyed by (seed, epoch, *global* batch index, hop, node, draw), so the union of
the ranks' samples is exactly the single-process sample of the global batch.  Each rank scales its
mean loss by ``n_r * world / g`` (``n_r`` its seeds, ``g`` the global batch's); DDP averages
gradients over ranks, so the update is the gradient of the global batch's mean loss: one process
with batch ``2B`` and two with ``B`` each train the same model up to float rounding (tested).

Equal step counts.  Every rank performs one step per global batch, ``ceil(S / (world * B))`` per
epoch, whatever ``S``.  When the last global batch has fewer seeds than ranks (``g < world``), a rank
whose slice is empty trains on one real wrap-around id of that batch with loss weight 0: it runs the
same forward/backward and joins every all-reduce, and contributes nothing.  No seed is dropped; no
seed is counted twice.

Evaluation (:meth:`ShardedTask.evaluate`): the unique validation/test ids are split into ``world``
contiguous slices; each rank counts (correct, total) -- micro-F1 counts for multi-label -- on its
slice with full neighbourhoods and the counts are all-reduced, so the score is exactly the
single-process one.  A rank with no ids contributes zeros and still joins the all-reduce.

Failure handling.  Collectives run on process groups created with ``timeout = --dist-timeout``
(default 60 s): a rank that stops answering makes the others raise within that time; a rank that
dies closes its sockets, so the others fail at their next collective, usually at once.  The launcher
watches its children and, when one exits non-zero, terminates the other local ranks and exits
non-zero; children die with their launcher (``PR_SET_PDEATHSIG``).  The initial rendezvous waits
``--dist-init-timeout`` (default 600 s: machines may start minutes apart).

Backends: NCCL for CUDA devices (DDP all-reduce on the GPU), gloo otherwise; control messages
(counts, metrics, the shared-buffer handshake) always go through a gloo group on the CPU.
Reference: DDP, Li et al., "PyTorch Distributed: experiences on accelerating data parallel
training", VLDB'20.
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
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as tdist

from ooc.loader import EpochPlan, plan_epoch

__all__ = ["LaunchSpec", "DistContext", "ShardedPlan", "ShardedTask", "shard_plan", "parse_devices",
           "free_port", "launch", "init_from_env", "torchrun_env_present", "train_worker",
           "launch_spec_from_args", "run_cli"]

log = logging.getLogger("ooc.distributed")

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_INIT_TIMEOUT_S = 600.0


# ====================================================================== devices and ports
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
    """Body of a spawned rank: apply its environment, run ``fn(*args)``, exit 0 or 1."""
    _set_pdeathsig()
    os.environ.update(env)
    rank = env.get("RANK", "?")
    try:
        fn(*args)
    except BaseException as e:  # noqa: BLE001 -- reported, then the process ends non-zero
        traceback.print_exc()
        msg = f"{type(e).__name__}: {e}"
        if any(t in str(e) for t in _PEER_LOST):
            msg = f"lost contact with another rank (it died or stopped answering): {msg}"
        print(f"ooc: rank {rank} failed: {msg}", file=sys.stderr, flush=True)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)  # do not wait for threads blocked in I/O or collectives
    sys.stdout.flush()
    sys.stderr.flush()


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
        0 if every local rank succeeded, 1 if one failed, 124 on ``timeout_s``.

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
        return 124 if failed[0] == -2 else 1
    return 0


# ====================================================================== the process group
def torchrun_env_present() -> bool:
    """True when this process was started as one rank of a job (torchrun or ooc's launcher)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                          "MASTER_PORT"))


@dataclass
class DistContext:
    """This process's place in the job and the process groups it talks through.

    Attributes:
        rank, world_size: global; local_rank, local_world_size: on this machine; node_rank: the
        machine's index.  device: this rank's device.  backend: of ``group`` (DDP); ``ctrl`` is a
        gloo group for CPU-side control collectives.  timeout_s: collective timeout.
        shared_buffer: local ranks share one partition buffer (set from the configuration).
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    device: torch.device
    backend: str
    timeout_s: float
    group: Any = None
    ctrl: Any = None
    shared_buffer: bool = True

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ helpers
    def run_dir(self, base: str | os.PathLike) -> Path:
        """Rank 0 writes the run directory itself; rank ``r > 0`` writes ``RUN/rank{r}`` (its own
        checkpoint, so each rank resumes from its own RNG state)."""
        return Path(base) if self.rank == 0 else Path(base) / f"rank{self.rank}"

    def all_reduce_sum(self, values: list[float] | np.ndarray, dtype: torch.dtype = torch.float64
                       ) -> np.ndarray:
        """Element-wise sum over ranks (CPU, gloo)."""
        t = torch.tensor(np.asarray(values), dtype=dtype)
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM, group=self.ctrl)
        return t.numpy()

    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        tdist.all_gather_object(out, obj, group=self.ctrl)
        return out

    def all_gather_int(self, v: int) -> list[int]:
        t = torch.tensor([int(v)], dtype=torch.int64)
        out = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        tdist.all_gather(out, t, group=self.ctrl)
        return [int(x) for x in out]

    def barrier(self) -> None:
        tdist.barrier(group=self.ctrl)

    # ------------------------------------------------------------------ training hooks
    def wrap_model(self, model: torch.nn.Module, seed: int) -> torch.nn.Module:
        """DDP around ``model`` (parameters broadcast from rank 0).  Also reseeds torch per rank
        (``seed`` mixed with the rank) so dropout masks differ between ranks."""
        from torch.nn.parallel import DistributedDataParallel as DDP
        ids = [self.device.index] if self.device.type == "cuda" else None
        net = DDP(model, device_ids=ids, process_group=self.group)
        torch.manual_seed((seed * 1_000_003 + self.rank + 1) % (2**63))
        return net

    def wrap_task(self, task: Any) -> "ShardedTask":
        return ShardedTask(task, self)

    def make_buffer(self, features: Any, offsets: np.ndarray, capacity: int, io_threads: int = 1) -> Any:
        """The partition buffer of this rank: with ``shared_buffer`` and several local ranks, one
        buffer per machine in shared memory (:mod:`ooc.data.shared`) -- local rank 0 owns it and does the
        I/O, the others map it; otherwise a private :class:`~ooc.buffer.PartitionBuffer`.

        Every rank calls this at the same point (it runs one all-gather and one barrier)."""
        from ooc.buffer import PartitionBuffer
        from ooc.data.shared import SharedFollowerBuffer, SharedOwnerBuffer, SharedSegment, SlotTable
        share = self.shared_buffer and self.local_world_size > 1
        offsets = np.asarray(offsets, dtype=np.int64)
        slot_rows = int(np.diff(offsets).max())
        row_shape = tuple(int(s) for s in features.shape[1:])
        dtype = np.dtype(features.dtype)
        row_bytes = int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize
        nbytes = SlotTable.nbytes(capacity, offsets.shape[0] - 1, slot_rows, row_bytes,
                                  self.local_world_size)
        seg = None
        if share and self.local_rank == 0:
            SharedSegment.remove_stale()
            seg = SharedSegment(SharedSegment.new_path(f"buf-n{self.node_rank}"), nbytes, create=True)
            table = SlotTable(seg, capacity, offsets.shape[0] - 1, slot_rows, row_shape, dtype,
                              self.local_world_size)
            table.init_owner()
        names = self.all_gather_object((self.node_rank, self.local_rank, str(seg.path) if seg else ""))
        if not share:
            self.barrier()
            return PartitionBuffer(features, offsets, capacity, io_threads=io_threads)
        try:
            if seg is None:
                path = next(p for (n, lr, p) in names if n == self.node_rank and lr == 0)
                if not path:
                    raise RuntimeError(f"node {self.node_rank}: local rank 0 created no shared buffer")
                seg = SharedSegment(path, nbytes, create=False)
                table = SlotTable(seg, capacity, offsets.shape[0] - 1, slot_rows, row_shape, dtype,
                                  self.local_world_size)
                buf: Any = SharedFollowerBuffer(features, offsets, capacity, table, self.local_rank,
                                                timeout_s=self.timeout_s)
            else:
                buf = SharedOwnerBuffer(features, offsets, capacity, io_threads, table,
                                        timeout_s=self.timeout_s)
        finally:
            self.barrier()  # everyone has mapped it (or failed) ...
            if seg is not None and seg.owner:
                seg.unlink()  # ... so the name can go: nothing is left behind if the job dies
        log.info("rank %d: shared buffer %s (%s, %.1f MiB)", self.rank, seg.path,
                 "owner" if seg.owner else "follower", nbytes / 2**20)
        return buf

    def host_memory(self) -> dict:
        """Host memory of every rank now (one all-gather), for the epoch record:
        ``host_memory`` = per rank ``{rank, node, rss, rss_anon, rss_shmem, pss}`` (bytes, see
        :func:`ooc.data.shared.memory_of`) and ``host_memory_bytes`` = the sum of ``pss``, which counts a
        shared buffer page once however many ranks map it."""
        from ooc.data.shared import memory_of
        mine = dict(memory_of(), rank=self.rank, node=self.node_rank)
        allm = self.all_gather_object(mine)
        return {"host_memory": allm, "host_memory_bytes": int(sum(m["pss"] for m in allm))}

    def check_resume(self, global_step: int) -> None:
        """Raise RuntimeError unless every rank resumed at the same step."""
        steps = self.all_gather_int(global_step)
        if len(set(steps)) != 1:
            raise RuntimeError(f"ranks resumed at different steps {steps}: the per-rank checkpoints "
                               "(RUN/checkpoint.pt, RUN/rank*/checkpoint.pt) are not from one moment")

    def summary(self, steps: int) -> dict:
        """Job facts for ``metrics.json`` (one all-gather): world size, backend, devices and the
        optimiser steps every rank performed."""
        info = self.all_gather_object({"steps": int(steps), "device": str(self.device),
                                       "node": self.node_rank, "host": socket.gethostname(),
                                       "pid": os.getpid()})
        return {"world_size": self.world_size, "rank": self.rank, "backend": self.backend,
                "local_world_size": self.local_world_size, "nnodes": self.world_size // max(
                    self.local_world_size, 1), "steps_per_rank": [i["steps"] for i in info],
                "devices": [i["device"] for i in info], "nodes": [i["node"] for i in info],
                "shared_buffer": bool(self.shared_buffer and self.local_world_size > 1)}

    def close(self) -> None:
        """Leave the job (destroys the process groups)."""
        if tdist.is_initialized():
            tdist.destroy_process_group()


def init_from_env(timeout_s: float | None = None) -> DistContext:
    """Join the job described by torchrun's environment variables (also set by :func:`launch`).

    Device: ``OOC_DEVICE`` if set (ooc's launcher), else ``cuda:LOCAL_RANK`` when CUDA is
    available, else CPU.  Backend: ``OOC_DIST_BACKEND``, else NCCL on CUDA and gloo on CPU.

    Raises:
        RuntimeError: the rendezvous fails or times out (``OOC_DIST_INIT_TIMEOUT`` seconds).
    """
    env = os.environ
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    local_rank = int(env.get("LOCAL_RANK", 0))
    local_world = int(env.get("LOCAL_WORLD_SIZE", 1))
    node_rank = int(env.get("GROUP_RANK", rank // max(local_world, 1)))
    if "OOC_DEVICE" in env:
        device = torch.device(env["OOC_DEVICE"])
    elif torch.cuda.is_available():
        device = torch.device(f"cuda:{local_rank}")
    else:
        device = torch.device("cpu")
    backend = env.get("OOC_DIST_BACKEND") or ("nccl" if device.type == "cuda" else "gloo")
    timeout = float(timeout_s or env.get("OOC_DIST_TIMEOUT", DEFAULT_TIMEOUT_S))
    init_timeout = float(env.get("OOC_DIST_INIT_TIMEOUT", DEFAULT_INIT_TIMEOUT_S))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    kw: dict = {}
    if backend == "nccl":
        kw["device_id"] = device
    tdist.init_process_group(backend, init_method="env://", rank=rank, world_size=world,
                             timeout=timedelta(seconds=init_timeout), **kw)
    # the groups training talks through fail after `timeout` (the rendezvous may take longer)
    group = tdist.new_group(backend=backend, timeout=timedelta(seconds=timeout))
    ctrl = group if backend == "gloo" else tdist.new_group(backend="gloo",
                                                          timeout=timedelta(seconds=timeout))
    if device.type == "cpu":
        torch.set_num_threads(max(1, int(env.get("OMP_NUM_THREADS", 0) or
                                         (os.cpu_count() or 1) // max(local_world, 1))))
    return DistContext(rank, world, local_rank, local_world, node_rank, device, backend, timeout,
                       group, ctrl)


# ====================================================================== sharding
@dataclass
class ShardedPlan(EpochPlan):
    """One rank's share of a global :class:`~ooc.loader.EpochPlan`.

    ``batches[i]`` is this rank's slice of global batch ``i`` (same index: the sampler key is the
    global batch's); ``batch_parts`` / ``schedule`` / ``batch_pos`` are the global plan's (so every
    local rank asks the buffer for the same partitions in the same order).

    Attributes:
        weights: per batch, the loss weight ``n_r * world / g`` (0 for a wrap-around pad).
        global_sizes: per batch, ``g`` (seeds of the global batch).
        real: per batch, seeds of this slice that count (0 for a pad).
    """

    weights: list[float] = field(default_factory=list)
    global_sizes: list[int] = field(default_factory=list)
    real: list[int] = field(default_factory=list)


def shard_plan(plan: EpochPlan, rank: int, world: int) -> ShardedPlan:
    """Rank ``rank``'s slices of every global batch of ``plan`` (see the module docstring).

    Global batch ``i`` with ``g`` seeds is cut into ``world`` contiguous slices of ``g // world``
    or ``g // world + 1`` seeds (the first ``g % world`` slices are the longer ones).  An empty slice
    (``g < world``) becomes ``[seeds[rank % g]]`` with weight 0.
    """
    batches, weights, sizes, real = [], [], [], []
    for seeds in plan.batches:
        g = int(seeds.shape[0])
        q, rem = divmod(g, world)
        start = rank * q + min(rank, rem)
        n = q + (1 if rank < rem else 0)
        if n > 0:
            batches.append(seeds[start:start + n])
            weights.append(n * world / g)
            real.append(n)
        else:
            batches.append(seeds[rank % g:rank % g + 1])
            weights.append(0.0)
            real.append(0)
        sizes.append(g)
    return ShardedPlan(batches, plan.batch_parts, plan.schedule, plan.batch_pos, weights, sizes, real)


class ShardedTask:
    """A task (:class:`~ooc.train.NodeTask`) trained data-parallel: sharded plans, weighted losses,
    exact distributed evaluation and epoch sums reduced over ranks.  Everything else is delegated
    to the wrapped task."""

    def __init__(self, task: Any, ctx: DistContext) -> None:
        if getattr(task, "name", "") != "node":
            raise NotImplementedError(f"data-parallel training supports node tasks, not "
                                      f"{getattr(task, 'name', task)!r}")
        self.inner = task
        self.ctx = ctx
        self._plan: ShardedPlan | None = None
        # every machine reads its own dataset copy: they must agree, or step counts would differ
        ds = task.ds
        ids = task.train_ids
        mine = (int(ds.num_nodes), int(ds.num_edges), int(ds.feat_dim), int(ids.shape[0]),
                int(ids.sum()), int(task.val_ids.shape[0]), int(task.test_ids.shape[0]))
        every = ctx.all_gather_object(mine)
        if len(set(every)) != 1:
            raise ValueError("the ranks' dataset copies differ (nodes, edges, feature dim, train/valid/"
                             f"test counts): {sorted(set(every))}; every machine needs the same dataset")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def global_batch_size(self) -> int:
        return self.inner.cfg.batch_size * self.ctx.world_size

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.inner.train_ids.shape[0] // self.global_batch_size)

    def plan(self, epoch: int) -> ShardedPlan:
        t = self.inner
        full = plan_epoch(t.train_ids, t.part_of_train, t.data.buffer.num_parts, self.global_batch_size,
                          t.cfg.seed, epoch)
        self._plan = shard_plan(full, self.ctx.rank, self.ctx.world_size)
        return self._plan

    def batches(self, plan: EpochPlan, epoch: int, start: int) -> Any:
        return self.inner.batches(plan, epoch, start)

    def loss(self, model: Any, batch: Any, device: torch.device) -> tuple[torch.Tensor, dict]:
        loss, st = self.inner.loss(model, batch, device)
        assert self._plan is not None
        w = self._plan.weights[batch.index]
        st["loss_value"] = float(loss.detach())
        if self._plan.real[batch.index] == 0:  # a wrap-around pad: runs, counts for nothing
            for k in ("seen", "correct", "tp", "err", "edges"):
                st[k] = 0
        return loss * w, st

    def epoch_end(self, acc: dict) -> dict:
        """The epoch's running sums added over ranks (loss, seeds, hits, sampled edges); timings
        stay this rank's."""
        keys = ("loss", "seen", "correct", "tp", "err", "edges")
        tot = self.ctx.all_reduce_sum([float(acc[k]) for k in keys])
        out = dict(acc)
        for k, v in zip(keys, tot):
            out[k] = float(v) if k == "loss" else int(round(v))
        return out

    @torch.no_grad()
    def evaluate(self, model: Any, device: torch.device) -> dict:
        """Validation/test scores over all ranks, exactly the single-process values (see the
        module docstring) with full neighbourhoods; with sampled ``eval_fanouts`` each rank samples
        its own share, so the scores are estimates that differ from a single process's.  Layer-wise
        mode runs the same full inference on every rank."""
        t = self.inner
        if t.cfg.eval_mode == "layerwise":
            return t.evaluate(model, device)
        from ooc.config import evaluation_fanouts
        from ooc.train import _scores, _to_device
        counts = []
        model.eval()
        for ids in (t.val_ids, t.test_ids):
            mine = np.array_split(np.unique(ids), self.ctx.world_size)[self.ctx.rank]
            c = [0, 0, 0, 0]
            for i in range(0, mine.shape[0], t.cfg.eval_batch_size):
                b = t.data.loader.make_batch(i, mine[i:i + t.cfg.eval_batch_size], epoch=-1,
                                             fanouts=evaluation_fanouts(t.cfg))
                blocks, x = _to_device(b, device)
                s = _scores(model(blocks, x).float().cpu(), b.y, t.multilabel)
                c = [a + v for a, v in zip(c, s)]
            counts.extend(c)
        tot = self.ctx.all_reduce_sum(counts, dtype=torch.int64)
        out = {}
        for key, (correct, total, tp, err) in (("val_acc", tot[0:4]), ("test_acc", tot[4:8])):
            if t.multilabel:
                out[key] = float(2 * tp / max(2 * tp + err, 1))
            else:
                out[key] = float(correct / total) if total else 0.0
        return out


# ====================================================================== the CLI's worker
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


def train_worker(cfg_dict: dict, resume: bool) -> None:
    """One rank of ``ooc train --devices ...`` (or of a torchrun job): join, train, leave."""
    import logging as _logging

    from ooc.config import TrainConfig
    from ooc.train import train
    if not _logging.getLogger().handlers:
        _logging.basicConfig(level=_logging.WARNING,
                             format="%(asctime)s %(name)s %(levelname)s %(message)s")
    import threading

    from tqdm import tqdm
    tqdm.set_lock(threading.RLock())  # not tqdm's default multiprocessing lock: a killed rank leaks none
    ctx = init_from_env()
    try:
        cfg = TrainConfig().update(cfg_dict, source="launcher")
        cfg.progress = cfg.progress and ctx.is_main
        train(cfg, resume=resume, dist=ctx)
    finally:
        ctx.close()


def run_cli(cfg: Any, resume: bool, spec: LaunchSpec | None) -> int:
    """``ooc train`` with ``--devices`` / ``--nnodes`` (``spec``) or inside a torchrun job
    (``spec`` None): launch or join, and return the exit status."""
    if spec is None:
        train_worker(cfg.to_dict(), resume)
        return 0
    return launch(train_worker, (cfg.to_dict(), resume), spec)
