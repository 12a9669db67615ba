"""Job bodies for the data-parallel tests: run in every spawned rank by :func:`ooc.distributed.launch`.

Module-level functions so that spawned processes can import them by name (``tests/`` is on the
parent's ``sys.path``, which spawn hands to the children).
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import torch

from ooc.config import TrainConfig
from ooc.data.budget import release_free_memory
from ooc.distributed.context import init_from_env
from ooc.training.loop import Interrupted, train


def _cfg(ds: str, out: Path, **kw: object) -> TrainConfig:
    base = dict(dataset=ds, output_dir=str(out), model="sage", fanouts=[2], hidden=8, epochs=1,
                batch_size=2, eval_batch_size=2, partitions=1, buffer_partitions=1, dropout=0.0,
                progress=False, seed=5, prefetch=1)
    base.update(kw)
    return TrainConfig(**base)


def steps_and_eval(ds_many: str, ds_few: str, out: str) -> None:
    """4097 seeds with batch 1024 and 10 seeds with batch 2 (also: 3 validation nodes, eval batch 2):
    each rank writes the all-gathered step counts and the distributed scores; rank 0 adds the
    single-process score of the same weights."""
    ctx = init_from_env()
    res: dict = {"rank": ctx.rank}
    try:
        m = train(_cfg(ds_many, Path(out) / "many", batch_size=1024, eval_batch_size=1024), job=ctx)
        res["many_steps"] = m["distributed"]["steps_per_rank"]
        m = train(_cfg(ds_few, Path(out) / "few"), job=ctx)
        res["few_steps"] = m["distributed"]["steps_per_rank"]
        res["few_val"] = m["history"][0]["val_acc"]
        res["few_test"] = m["history"][0]["test_acc"]
        # resume under DDP: every rank restarts from its own checkpoint, bit-exact
        kw = dict(epochs=3, checkpoint_every=1, dropout=0.3)
        full = train(_cfg(ds_few, Path(out) / "full", **kw), job=ctx)
        try:
            train(_cfg(ds_few, Path(out) / "cut", **kw), job=ctx, stop_after_steps=3)
        except Interrupted:
            pass
        cut = train(_cfg(ds_few, Path(out) / "cut", **kw), resume=True, job=ctx)
        res["resume_losses_equal"] = full["losses"] == cut["losses"]
        res["resume_weights_equal"] = all(
            torch.equal(a, b) for a, b in zip(_final(ctx, Path(out) / "full").values(),
                                               _final(ctx, Path(out) / "cut").values()))
        if ctx.rank == 0:  # the single-process metric of the very same weights
            from ooc.storage.dataset import Dataset
            from ooc.tasks.node import NodeTask, evaluate_nodes
            from ooc.training.loop import make_model
            cfg = _cfg(ds_few, Path(out) / "single")
            cfg.validate()
            ds = Dataset(ds_few)
            task = NodeTask(cfg, ds)
            model = make_model(cfg, ds.feat_dim, task.out_dim)
            model.load_state_dict(torch.load(Path(out) / "few" / "model.pt", weights_only=True))
            for key, split in (("single_val", "valid"), ("single_test", "test")):
                c = evaluate_nodes(model, task.data, ds.split(split), 1, 2)
                res[key] = float(c[0] / c[1])
            task.close()
            ds.close()
    finally:
        ctx.close()
    (Path(out) / f"result{res['rank']}.json").write_text(json.dumps(res))


def _final(ctx, run: Path) -> dict:
    return torch.load(ctx.run_dir(run) / "checkpoint.pt", weights_only=True)["model"]


def memory(ds: str, out: str) -> None:
    """Train one epoch with every partition resident, without and with the shared buffer; each
    run's epoch record holds every rank's memory (all-gathered).  A first run with a one-partition
    buffer warms the processes up (one-time allocations of the runtime), so that the memory each
    measured run gains is its buffer's."""
    ctx = init_from_env()
    try:
        train(_cfg(ds, Path(out) / "warmup", partitions=4, buffer_partitions=1, batch_size=256,
                   shared_buffer=False, eval_every=100), job=ctx)
        for shared in (False, True):
            gc.collect()  # the first run's private buffer is gone before the second is measured
            # and freed heap returned (also what a forked rank inherited from the test process):
            # otherwise the run's own end-of-epoch trim hides part of what it gained
            release_free_memory()
            start = ctx.host_memory()["host_memory"]
            m = train(_cfg(ds, Path(out) / f"shared{int(shared)}", partitions=4, buffer_partitions=4,
                           batch_size=256, fanouts=[2], shared_buffer=shared, eval_every=100,
                           epochs=1), job=ctx)
            if ctx.rank == 0:
                h = m["history"][0]
                rec = {"host_memory": h["host_memory"], "start_memory": start, "host_memory_bytes": h["host_memory_bytes"],
                       "buffer_bytes": m["buffer_bytes"], "partition_loads": h["partition_loads"],
                       "losses": m["losses"]}
                (Path(out) / f"memory{int(shared)}.json").write_text(json.dumps(rec))
    finally:
        ctx.close()



def modes_and_tasks(ds: str, out: str, budgets: dict) -> None:
    """{exact, buffer, hybrid} x {node, link} on two ranks under one machine budget: each rank
    writes, per combination, the step counts of all ranks, the seeds (edges) its plan trains in
    epoch 0, the machine's data memory peak and the buffer's facts."""
    import numpy as np

    from ooc.storage.dataset import Dataset
    from ooc.training.loop import make_task
    ctx = init_from_env()
    res: dict = {}
    try:
        for task in ("node", "link"):
            for mode in ("exact", "buffer", "hybrid"):
                budget = budgets[f"{task}-{mode}"]
                kw = dict(task=task, mode=mode, memory_budget=str(budget), fanouts=[5, 5], hidden=16,
                          batch_size=32 if task == "node" else 256, eval_batch_size=256,
                          partitions=8, eval_candidates=100, buffer_partitions=2,
                          topology="memory")
                name = f"{task}-{mode}"
                m = train(_cfg(ds, Path(out) / name, **kw), job=ctx)
                cfg = _cfg(ds, Path(out) / (name + "-plan"), **kw)
                cfg.validate()
                d = Dataset(ds)
                t = make_task(cfg, d, ctx)
                plan = t.plan(0)
                seen = np.concatenate([b[:plan.real[i]] for i, b in enumerate(plan.batches)])
                t.close()
                d.close()
                res[name] = {"steps_per_rank": m["distributed"]["steps_per_rank"],
                             "seen": seen.tolist(), "loss": m["history"][0]["loss"],
                             "machine_data_peak": m["history"][0]["machine_data_peak_bytes"],
                             "shared_buffer": m["distributed"]["shared_buffer"],
                             "slots": m["budget"]["slots"], "planned": m["budget"]["planned"]}
    finally:
        ctx.close()
    (Path(out) / f"modes{ctx.rank}.json").write_text(json.dumps(res))


def hot_topology(ds_path: str, out: str, size: int) -> None:
    """Two local ranks build one data path with ``--topology disk --hot-topology size``: each rank
    writes whether its hot arrays are the machine's shared (read-only) copy, whether they equal a
    private build, and whether its samples over the reader equal the in-memory samples."""
    import numpy as np

    from ooc.data.path import build_data_path
    from ooc.kernels.disk_sampling import sample_blocks_lists
    from ooc.kernels.sampling import sample_blocks
    from ooc.storage.dataset import Dataset
    from ooc.storage.io import HotLists, NeighborReader
    ctx = init_from_env()
    try:
        ds = Dataset(ds_path)
        cfg = _cfg(ds_path, Path(out) / "hot", topology="disk", hot_topology=str(size),
                   partitions=8, buffer_partitions=2, fanouts=[5, 5])
        data = build_data_path(cfg, ds, ctx)
        hot = data.graph.reader.hot
        ref_reader = NeighborReader(ds.raw("indices"), ds.indptr)
        ref = HotLists.build(ref_reader, size, 5)
        same = all(np.array_equal(getattr(hot, k), getattr(ref, k)) for k in ("bits", "rank", "ptr", "ids"))
        rng = np.random.default_rng(ctx.rank)
        equal = True
        for i in range(5):
            seeds = rng.choice(ds.num_nodes, 64, replace=False)
            b = sample_blocks(ds.indptr, ds.indices, seeds, [5, 5], np.uint64(i))
            c = sample_blocks_lists(data.graph.reader.read, ds.num_nodes, seeds, [5, 5], np.uint64(i))
            equal &= bool(np.array_equal(b.nodes, c.nodes)) and all(
                np.array_equal(x.indices, y.indices) and np.array_equal(x.indptr, y.indptr)
                for x, y in zip(b.blocks, c.blocks))
        rec = {"rank": ctx.rank, "shared": not hot.ids.flags.writeable, "num_nodes": hot.num_nodes,
               "nbytes": hot.nbytes, "same": same, "equal": equal,
               "hot_lists": data.graph.reader.lists_hot}
        (Path(out) / f"hot{ctx.rank}.json").write_text(json.dumps(rec))
        ref_reader.close()
        data.close()
    finally:
        ctx.close()



def aborting_teardown(out: str) -> None:
    """Write a marker from an ``atexit`` handler, print without flushing, and register C's
    ``abort`` as an exit handler (``__cxa_atexit``): it runs as the process exits, after the interpreter's
    finalisation, as a library's C++ static destructor does (one that finds a thread still joinable
    calls ``std::terminate``)."""
    import atexit
    import ctypes
    atexit.register(lambda: Path(out, "atexit-ran").write_text("1"))
    libc = ctypes.CDLL(None)  # __cxa_atexit is how a C++ static object registers its destructor
    libc.__cxa_atexit.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    assert libc.__cxa_atexit(ctypes.cast(libc.abort, ctypes.c_void_p), None, None) == 0
    print("rank done", end="", flush=False)  # unflushed: the rank's exit must flush it
