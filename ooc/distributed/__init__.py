"""Data-parallel training: one process per device, several machines, one code path.

- :mod:`ooc.distributed.launch` -- ``ooc train --devices N`` / ``--nnodes``: one process per
  device with torchrun's environment; failure handling of the launcher.
- :mod:`ooc.distributed.context` -- :class:`~ooc.distributed.context.DistContext`, the
  :class:`ooc.contracts.Job` of a rank (process groups, collectives, run directories).

What data parallelism changes elsewhere is a function of the plan (:func:`ooc.data.plan.shard_plan`:
every rank the same number of steps, weighted shares so that the update equals the single-process
update of the global batch), one buffer per machine in shared memory (:mod:`ooc.data.buffer`), and
the tasks' all-reduced sums and evaluation counts.  Reference: DDP, Li et al., "PyTorch
Distributed: experiences on accelerating data parallel training", VLDB'20.
"""

from ooc.distributed.context import DistContext, init_from_env, torchrun_env_present
from ooc.distributed.launch import LaunchSpec, free_port, launch, launch_spec_from_args, parse_devices, run_cli

__all__ = ["DistContext", "init_from_env", "torchrun_env_present", "LaunchSpec", "free_port", "launch",
           "launch_spec_from_args", "parse_devices", "run_cli"]
