"""This process's place in a data-parallel job: process groups, collectives, run directories.

:func:`init_from_env` joins the job described by torchrun's environment variables (set by
:func:`ooc.distributed.launch.launch` too) and returns a :class:`DistContext`, the
:class:`ooc.contracts.Job` of a rank.  Backends: NCCL for CUDA devices (DDP all-reduce on the
GPU), gloo otherwise; control messages (counts, metrics, the shared-memory handshakes) always go
through a gloo group on the CPU.  Collectives run on groups created with ``timeout =
--dist-timeout``; the rendezvous alone waits ``--dist-init-timeout``.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist

__all__ = ["DistContext", "init_from_env", "torchrun_env_present", "DEFAULT_TIMEOUT_S",
           "DEFAULT_INIT_TIMEOUT_S"]

log = logging.getLogger("ooc.distributed")

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_INIT_TIMEOUT_S = 600.0


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
        gloo group for CPU-side control collectives.  timeout_s: collective timeout (and how long a
        shared-buffer peer may stay silent).

    Implements the :class:`ooc.contracts.Job` protocol.
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

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def num_machines(self) -> int:
        return self.world_size // max(self.local_world_size, 1)

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
                "machines": self.num_machines}

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
