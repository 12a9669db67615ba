"""The training loop (``ooc train``): one loop for every task, mode and number of ranks.

Structure:

- a *task* (:class:`ooc.tasks.node.NodeTask`, :class:`ooc.tasks.link.LinkTask`; the
  :class:`ooc.contracts.Task` protocol) turns an epoch into this rank's batches, a batch into a
  loss, and a model into validation/test metrics; it owns the run's data path
  (:mod:`ooc.data.path`).
- :func:`train` -- the loop: optimiser, learning-rate schedule, mixed precision (CUDA), early
  stopping, best-model selection, checkpoints (every ``checkpoint_every`` steps and at every epoch
  end) and resume, per-epoch ``metrics.jsonl`` and per-step ``steps.jsonl``.  In a data-parallel
  job (``job``: :class:`ooc.distributed.context.DistContext`) every rank runs it; one process is the
  job of one rank (:class:`ooc.contracts.SingleProcess`).

Determinism: batches depend only on (seed, epoch, batch index) and the layers are deterministic on
CPU, so a resumed run (``train(cfg, resume=True)``, ``ooc train --resume RUN``) reproduces the
uninterrupted run bit for bit: the checkpoint holds model, optimiser, scheduler, GradScaler, every
RNG state, the loader position (epoch, next batch) and the running sums of the current epoch.

Run directory::

    RUN/config.yaml, config.json   resolved configuration (nested YAML reusable with --config; flat JSON)
    RUN/checkpoint.pt              latest checkpoint (atomic; torch.load(weights_only=True))
    RUN/model.pt                   best-validation weights (a plain state_dict)
    RUN/metrics.jsonl              one JSON record per epoch (loss, accuracy, throughput, I/O)
    RUN/steps.jsonl                one record per step (time, I/O stall, compute, loss): the timeline
    RUN/metrics.json               final summary (test/val score at the best epoch, I/O, memory...)
    RUN/rank{r}/                   rank r > 0 of a data-parallel job: its own checkpoint and records
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
import time
from contextlib import closing, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ooc.config import TrainConfig
from ooc.contracts import Job, SingleProcess, Task
from ooc.data.budget import RssMonitor, high_water_bytes
from ooc.models import build_model
from ooc.storage.dataset import Dataset, dataset_identity, read_manifest
from ooc.training.rundir import guarded
from ooc.training.checkpoint import CHECKPOINT_FORMAT, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from ooc.util.files import read_jsonl, temp_sibling, write_json_atomic, write_jsonl_atomic
from ooc.util.progress import progress as progress_bar
from ooc.util.signals import Terminated

__all__ = ["train", "DivergedError", "make_task", "make_model", "seed_everything", "peak_rss_bytes",
           "resolve_device", "Interrupted", "RESUMABLE_CHANGES"]

log = logging.getLogger("ooc.train")


class DivergedError(ValueError):
    """The training loss became NaN or infinite: the run stops before that step's update."""


class Interrupted(RuntimeError):
    """Raised by :func:`train` when ``stop_after_steps`` is reached (a simulated kill, for tests)."""


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA); the samplers are keyed by the run seed."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def peak_rss_bytes() -> int:
    """Peak resident set size of this process since the RSS monitor's last reset (bytes;
    :func:`ooc.data.budget.high_water_bytes`: its own pages, not its parent's)."""
    return high_water_bytes()


def _save_atomic(obj: object, path: Path) -> None:
    tmp = temp_sibling(path)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; otherwise ``torch.device(name)``.

    Raises:
        ValueError: a CUDA device is requested but none is available.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return dev


def make_task(cfg: TrainConfig, ds: Dataset, job: Job | None = None, rss: RssMonitor | None = None,
              reuse: dict | None = None) -> Task:
    """The task of ``cfg.task`` (``node`` or ``link``) on its data path, for this rank of ``job``
    (default: one process); ``reuse``: a resumed run's plan record (``build_data_path``).

    Raises:
        ValueError: a combination of options that cannot work, saying why.
    """
    if cfg.task == "link":
        from ooc.tasks.link import LinkTask
        return LinkTask(cfg, ds, job, rss, reuse)
    from ooc.tasks.node import NodeTask
    return NodeTask(cfg, ds, job, rss, reuse)


def make_model(cfg: TrainConfig, in_dim: int, out_dim: int, num_nodes: int = 0) -> torch.nn.Module:
    """The model a configuration describes (``len(fanouts)`` layers): a built-in
    :class:`~ooc.models.GNN`, or the user's ``MODULE:CLASS`` (:mod:`ooc.interop.custom`); with
    ``cfg.embedding`` = D wrapped in :class:`ooc.embedding.NodeEmbeddingInput`, whose table of
    ``num_nodes`` rows extends the ``in_dim`` feature columns to ``in_dim + D``.

    Raises:
        ValueError: a user's class that does not fit the contract (naming what is missing), or
            ``cfg.embedding`` without ``num_nodes``.
    """
    from ooc.interop.custom import build_custom_model, is_custom
    width = in_dim + cfg.embedding
    if is_custom(cfg.model):
        model: torch.nn.Module = build_custom_model(cfg, width, out_dim)
    else:
        model = build_model(cfg.model, width, cfg.hidden, out_dim, len(cfg.fanouts), cfg.dropout,
                            aggregator=cfg.aggregator, heads=cfg.heads, out_heads=cfg.out_heads,
                            attn_dropout=cfg.attn_dropout, residual=cfg.residual, norm=cfg.norm,
                            activation=cfg.activation, gin_eps=cfg.gin_eps,
                            gin_train_eps=cfg.gin_train_eps, feat_dropout=cfg.feat_dropout,
                            dropout_per_head=cfg.dropout_per_head, init=cfg.init)
    if not cfg.embedding:
        return model
    if num_nodes < 1:
        raise ValueError("--embedding needs the number of nodes (make_model(..., num_nodes=N))")
    from ooc.embedding import NodeEmbeddingInput
    return NodeEmbeddingInput(model, num_nodes, cfg.embedding, in_dim)


def _make_optimizer(cfg: TrainConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    params: Any = model.parameters()
    if cfg.weight_decay_scope == "first" and cfg.weight_decay:
        first = list(model.layers[0].parameters())
        ids = {id(p) for p in first}
        params = [{"params": first},
                  {"params": [p for p in model.parameters() if id(p) not in ids], "weight_decay": 0.0}]
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=0.9, weight_decay=cfg.weight_decay)
    return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def _make_scheduler(cfg: TrainConfig, opt: torch.optim.Optimizer) -> Any:
    if cfg.lr_schedule == "step":
        return torch.optim.lr_scheduler.StepLR(opt, step_size=max(cfg.lr_step, 1), gamma=cfg.lr_gamma)
    if cfg.lr_schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.epochs)
    if cfg.lr_schedule == "plateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=cfg.lr_gamma,
                                                          patience=cfg.lr_step)
    return None


# ====================================================================== loop state
@dataclass
class _State:
    """Everything of the loop that a checkpoint must restore (besides model/optimiser/RNG)."""

    epoch: int = 0            # current epoch
    step: int = 0             # next batch index within the epoch
    global_step: int = 0
    losses: list = field(default_factory=list)
    history: list = field(default_factory=list)
    best_val: float = -1.0
    best_test: float = 0.0
    top_val: float = -1.0             # early_stop score_or_loss: best score and loss seen so far
    min_val_loss: float = float("inf")
    best_epoch: int = -1
    bad_evals: int = 0
    stopped_early: bool = False
    elapsed_s: float = 0.0
    acc: dict = field(default_factory=dict)   # running sums of the current epoch
    totals: dict = field(default_factory=lambda: {"bytes_read": 0, "row_hits": 0, "row_misses": 0})

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _gat_rule(st: _State, val: float, scores: dict) -> tuple[bool, bool]:
    """Early stopping of Velickovic et al. (GAT reference code): ``(better, progress)`` for one
    evaluation.  ``progress`` (patience restarts) when the validation score is at least the best
    score so far *or* the validation loss at most the lowest so far; ``better`` (keep this model)
    when both hold.  Updates the running best score and lowest loss in ``st``.

    Raises:
        ValueError: the evaluation has no ``val_loss``.
    """
    if "val_loss" not in scores:
        raise ValueError("early_stop score_or_loss: this evaluation reports no val_loss")
    loss = float(scores["val_loss"])
    up, down = val >= st.top_val, loss <= st.min_val_loss
    st.top_val, st.min_val_loss = max(st.top_val, val), min(st.min_val_loss, loss)
    return up and down, up or down


def _machine_memory(job: Job, rec: dict, baseline: int) -> dict:
    """The machine's peak host memory in the epoch: its ranks' private peaks (sampled) plus the
    shared segments once (``machine_peak_bytes``), and that minus the ranks' runtime baselines
    (``machine_data_peak_bytes``, what the memory budget covers)."""
    mine = {"node": job.node_rank, "private": int(rec["peak_private_bytes"]),
            "shared": int(rec["shared_bytes"]), "baseline": int(baseline)}
    every = job.all_gather_object(mine) if job.world_size > 1 else [mine]
    here = [m for m in every if m["node"] == job.node_rank]
    peak = sum(m["private"] + m["shared"] for m in here)
    return {"machine_peak_bytes": peak,
            "machine_data_peak_bytes": peak - sum(m["baseline"] for m in here)}


def _fresh_acc() -> dict:
    return {"loss": 0.0, "seen": 0, "correct": 0, "tp": 0, "err": 0, "edges": 0, "sample_s": 0.0,
            "gather_s": 0.0, "stall_s": 0.0, "compute_s": 0.0, "train_time_s": 0.0}


def _fault_pause(global_step: int) -> None:
    """Test hook: ``OOC_FAULT_PAUSE_STEP=<step>:<seconds>[:<marker>]`` touches the marker and sleeps
    after that global step (and its checkpoint, if any), so a test can SIGKILL the run mid-epoch."""
    spec = os.environ.get("OOC_FAULT_PAUSE_STEP")
    if not spec:
        return
    parts = spec.split(":")
    if int(parts[0]) != global_step:
        return
    if len(parts) > 2:
        Path(parts[2]).touch()
    time.sleep(float(parts[1]))


#: Seconds between flushes of ``steps.jsonl`` during an epoch (a billion-edge epoch takes an hour).
STEPS_FLUSH_S = 10.0

#: Options a resumed run may change: they affect speed, logging or when training stops, never the
#: weights of an epoch (the buffer and prefetch depth do not change batches; tested).  In buffer and
#: hybrid mode a change that plans other buffer states (slots per state) is refused at resume.
RESUMABLE_CHANGES = frozenset({
    "epochs", "progress", "checkpoint_every", "output_dir", "threads", "device", "io_threads",
    "io_depth", "io_gap",
    "prefetch", "eval_batch_size", "patience", "eval_every", "eval_mode", "eval_fanouts",
    "buffer_partitions", "lookahead", "read_ahead", "sample_ahead",
    "topology", "hot_topology", "verify"})


#: Resumable options the budget split is planned from: a resumed run that changes none of them
#: plans the interrupted run's probed extents and split again instead of probing.
PLAN_INPUTS = ("topology", "hot_topology", "prefetch", "eval_batch_size", "eval_fanouts",
               "buffer_partitions", "lookahead", "read_ahead", "sample_ahead")


def _plan_to_reuse(ckpt: dict | None, cfg: TrainConfig) -> dict | None:
    """The checkpoint's plan record (``build_data_path(reuse=)``) when the resumed run plans from the
    same options, else None (probed again)."""
    if ckpt is None or ckpt.get("plan") is None:
        return None
    saved, now = ckpt.get("config", {}), cfg.to_dict()
    if any(saved.get(k) != now.get(k) for k in PLAN_INPUTS):
        return None
    return ckpt["plan"]


def _check_resume_config(saved: dict, now: dict) -> None:
    """Raise ValueError when ``now`` changes an option a resumed run must keep."""
    diff = [k for k in now if k in saved and k not in RESUMABLE_CHANGES and saved[k] != now[k]]
    if diff:
        raise ValueError("--resume: " + ", ".join(f"{k} {saved[k]!r} -> {now[k]!r}" for k in diff)
                         + " would change the training being resumed; only "
                         + ", ".join(sorted(RESUMABLE_CHANGES)) + " may change")


def _check_resume_dataset(saved: dict | None, now: dict, dataset: str, run: Path) -> None:
    """Raise ValueError when the dataset changed since ``run``'s checkpoint was written
    (:func:`~ooc.storage.dataset.dataset_identity`: partitioned again, converted or generated
    again into the same folder): its node ids would no longer be the checkpoint's.  A checkpoint
    without a recorded identity (written before it was kept) is not checked."""
    if saved is None or saved == now:
        return
    if saved.get("partitioning") != now.get("partitioning"):
        def name(p: dict | None) -> str:
            return "not partitioned" if not p else f"{p.get('num_parts')} {p.get('method')} partitions"
        what = (f"it was partitioned again ({name(saved.get('partitioning'))} then, "
                f"{name(now.get('partitioning'))} now: partitioning renumbers the nodes)")
    else:
        what = (f"it was written again (created {saved.get('created')} then, {now.get('created')} "
                f"now; {saved.get('num_nodes')} -> {now.get('num_nodes')} nodes)")
    raise ValueError(f"--resume {run}: the dataset {dataset} changed since the checkpoint: {what}; "
                     "the checkpoint's model and plan refer to the old node ids. Start a new run "
                     "instead of resuming (without --resume: another --output-dir, or --overwrite)")


def _check_resume_layout(saved: dict, now: dict, run: Path) -> None:
    """Raise ValueError when the job resuming ``run`` has another number of processes than the job
    that wrote it (the plan, the loss weights and the per-rank checkpoints depend on it)."""
    if int(saved.get("world_size", 1)) != now["world_size"] or \
            int(saved.get("local_world_size", 1)) != now["local_world_size"]:
        ws, lw = int(saved.get("world_size", 1)), int(saved.get("local_world_size", 1))
        how = "one process" if ws == 1 else f"{ws} processes ({lw} per machine: --devices {lw}" + \
            (f" --nnodes {ws // max(lw, 1)}" if ws > lw else "") + ")"
        raise ValueError(f"--resume {run}: the run was trained by {how}; resume it with the same "
                         f"layout (now {now['world_size']} process"
                         f"{'es' if now['world_size'] > 1 else ''})")


# ====================================================================== the loop
@guarded
def train(cfg: TrainConfig, resume: bool = False, stop_after_steps: int | None = None,
          job: Job | None = None) -> dict:
    """Train as configured; see the module docstring for the run directory.

    Args:
        cfg: the run configuration (validated here).
        resume: continue from ``RUN/checkpoint.pt`` (``cfg.output_dir``); the result is bit-identical
            to an uninterrupted run on CPU.
        stop_after_steps: raise :class:`Interrupted` after this many global steps (and the
            checkpoint due at that step, if any), as if the process were killed; for tests.
        job: this rank's place in a data-parallel job (:class:`ooc.distributed.context.DistContext`;
            None: one process on ``cfg.device``).  Rank 0 writes ``RUN``, rank ``r`` ``RUN/rank{r}``.

    Returns:
        The metrics dictionary (also written to ``metrics.json``): ``test_acc`` / ``val_acc`` (node
        tasks) or ``test_mrr`` / ``val_mrr`` and Hits@K (link), at the best validation epoch;
        ``best_epoch``, ``epochs``, ``epoch_time_s``, ``losses`` (per step), ``bytes_read``,
        ``buffer_hit_ratio``, ``peak_rss_bytes``, ``seed``, ``config``, per-epoch ``history``.

    Raises:
        DatasetError: the dataset cannot be opened.
        FileNotFoundError: ``resume`` without a checkpoint.
        ValueError: invalid options (e.g. more partitions than nodes, a budget too small).
        Interrupted: ``stop_after_steps`` reached.
    """
    cfg.validate()
    t_start = time.perf_counter()
    if job is None:
        job = SingleProcess(resolve_device(cfg.device))
    out = job.run_dir(cfg.output_dir)
    try:
        if job.world_size == 1 and not resume and not out.exists():
            try:  # set-up errors (no dataset, a budget too small) leave no half-made run folder
                out.mkdir(parents=True)
                return _train(cfg, out, resume, stop_after_steps, job, t_start)
            except BaseException:
                # keep the folder once it holds something to resume or read (a checkpoint, an
                # epoch's record); a run that failed before either (a corrupt chunk in epoch 0)
                # leaves none
                m = out / "metrics.jsonl"
                if not (out / "checkpoint.pt").exists() and not (m.exists() and m.stat().st_size):
                    shutil.rmtree(out, ignore_errors=True)
                raise
        out.mkdir(parents=True, exist_ok=True)
        return _train(cfg, out, resume, stop_after_steps, job, t_start)
    except (KeyboardInterrupt, Terminated) as e:
        # what the command says it left: the run's checkpoint, where there is one
        if getattr(e, "left", None) is None and (out / "checkpoint.pt").exists():
            msg = f"{out} keeps its last checkpoint: `ooc train --resume {out}` continues the run"
            e.left = msg  # type: ignore[union-attr]
        raise


def _finished(ckpt: dict, cfg: TrainConfig, out: Path) -> dict | None:
    """A resumed run with nothing left to train: its ``metrics.json`` as written when it finished
    (nothing in ``out`` is rewritten), or None when it has epochs left or did not finish (a run
    stopped at an epoch's end still writes its final evaluation)."""
    st, final = ckpt.get("state", {}), out / "metrics.json"
    if st.get("epoch", 0) < cfg.epochs or st.get("step", 0) or not final.exists():
        return None
    metrics = json.loads(final.read_text())
    if metrics.get("epochs_run") != st["epoch"]:  # an older finish, then more epochs interrupted
        return None
    _warn_nothing_left(out, st["epoch"], cfg.epochs, "; its files are left as they were")
    return metrics


def _warn_nothing_left(out: Path, trained: int, epochs: int, kept: str = "") -> None:
    log.warning("--resume %s: the run has trained %d epoch%s and --epochs is %d: nothing left to "
                "train%s (a larger --epochs trains on)", out, trained, "" if trained == 1 else "s",
                epochs, kept)


def _train(cfg: TrainConfig, out: Path, resume: bool, stop_after_steps: int | None, job: Job,
           t_start: float) -> dict:
    """The body of :func:`train` once its output folder exists."""
    from ooc.training.warmup import warm_up_runtime
    ckpt_path = out / "checkpoint.pt"
    ckpt = load_checkpoint(ckpt_path) if resume else None
    layout = {"world_size": job.world_size, "local_world_size": job.local_world_size}
    identity = dataset_identity(read_manifest(cfg.dataset))
    if ckpt is not None:
        _check_resume_config(ckpt.get("config", {}), cfg.to_dict())
        _check_resume_dataset(ckpt.get("dataset_identity"), identity, cfg.dataset, out)
        _check_resume_layout(ckpt.get("job", {"world_size": 1, "local_world_size": 1}), layout, out)
        done = _finished(ckpt, cfg, out) if job.world_size == 1 else None
        if done is not None:
            return done
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    # RSS baseline of the runtime, before any data (the budget excludes it); before seeding, so the
    # warm-up step does not move the random streams of the run
    from ooc.interop.custom import is_custom
    rss = warm_up_runtime("sage" if is_custom(cfg.model) else cfg.model, len(cfg.fanouts),
                          shared=job.local_world_size > 1)
    rss.start_sampling()
    seed_everything(cfg.seed)
    device = job.device
    use_amp = cfg.amp and device.type == "cuda"
    if cfg.amp and not use_amp:
        log.warning("--amp ignored on %s (mixed precision is used on CUDA only)", device)
    amp_dtype = torch.bfloat16 if use_amp and torch.cuda.is_bf16_supported() else torch.float16

    ds = Dataset(cfg.dataset)
    task = make_task(cfg, ds, job, rss, _plan_to_reuse(ckpt, cfg))
    if cfg.task == "node" and job.is_main and ds.split("valid").shape[0] == 0:
        log.warning("%s has no validation nodes: val_acc and val_loss read 0, so model.pt keeps the "
                    "weights of the first evaluation (use --weights last with ooc eval / ooc "
                    "predict for the latest)", cfg.dataset)
    model = make_model(cfg, ds.feat_dim, task.out_dim, ds.num_nodes)
    task.prepare_model(model)
    model.to(device)
    net = job.wrap_model(model, cfg.seed)  # DDP under data parallelism: trains `model`
    data = task.data
    cache = data.attach_device_cache(device, task.plan(0))  # None without --device-cache
    opt = _make_optimizer(cfg, model)
    sched = _make_scheduler(cfg, opt)
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp and amp_dtype == torch.float16) \
        if use_amp else None
    buffer = data.buffer
    log.info("dataset %s: %d nodes, %d edges, %d features, task %s (%d outputs); %d partitions, "
             "buffer %d (%.1f MiB); device %s", ds.name, ds.num_nodes, ds.num_edges, ds.feat_dim,
             task.name, task.out_dim, buffer.num_parts, buffer.capacity,
             buffer.nbytes / 2**20, device)

    st = _State()
    metrics_path, steps_path = out / "metrics.jsonl", out / "steps.jsonl"
    # buffer / hybrid batches follow the buffer states: a resumed run must plan the same ones
    states = {"state_slots": data.budget.state_slots, "group": data.budget.group} \
        if cfg.mode != "exact" else {}
    if ckpt is not None:
        saved = ckpt.get("states", states)
        if saved != states:
            task.close()
            ds.close()
            raise ValueError(
                f"--resume: {out} was trained with buffer states of {saved.get('state_slots')} "
                f"resident partitions (group {saved.get('group')}); the options given now plan "
                f"{states.get('state_slots')} (group {states.get('group')}), which would change the "
                f"{cfg.mode}-mode batches being resumed; resume with the interrupted run's "
                "--memory-budget, --topology, --hot-topology, --buffer-partitions and --cache-size")
    cfg.save(out)  # once the resume checks passed: a refused resume leaves the run's config as it was
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        if sched is not None and ckpt.get("scheduler") is not None:
            sched.load_state_dict(ckpt["scheduler"])
        if scaler is not None and ckpt.get("scaler") is not None:
            scaler.load_state_dict(ckpt["scaler"])
        for k, v in ckpt["state"].items():
            setattr(st, k, v)
        set_rng_state(ckpt["rng"])
        write_jsonl_atomic(metrics_path, st.history)
        write_jsonl_atomic(steps_path, [r for r in read_jsonl(steps_path) if r["step"] < st.global_step])
        log.info("resumed %s at epoch %d, batch %d (step %d)", out, st.epoch, st.step, st.global_step)
        if st.epoch >= cfg.epochs and st.step == 0:  # (one process returned in _finished)
            _warn_nothing_left(out, st.epoch, cfg.epochs)
        job.check_resume(st.global_step)
    else:
        for p in (metrics_path, steps_path):
            p.write_text("")
    steps_f = open(steps_path, "a")
    last_flush = time.perf_counter()  # flushed every STEPS_FLUSH_S: long epochs show progress

    def checkpoint() -> None:
        steps_f.flush()
        save_checkpoint({
            "format": CHECKPOINT_FORMAT, "model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict() if sched is not None else None,
            "scaler": scaler.state_dict() if scaler is not None else None, "rng": rng_state(),
            "state": dict(st.as_dict(), elapsed_s=st.elapsed_s + time.perf_counter() - t_start),
            "config": cfg.to_dict(), "job": layout, "states": states, "plan": data.plan_record,
            "dataset_identity": identity},
            ckpt_path)

    steps_per_epoch = task.steps_per_epoch
    bar = progress_bar(total=cfg.epochs * steps_per_epoch, initial=st.global_step, enabled=cfg.progress,
                   unit="batch", desc="train")
    elapsed0 = st.elapsed_s
    try:
        for epoch in range(st.epoch, cfg.epochs):
            if st.stopped_early:
                break
            t0 = time.perf_counter()
            rss.phase = "training"
            net.train()
            plan = task.plan(epoch)
            resumed_at = st.step  # > 0: this epoch resumes mid-way (its counters start there)
            if st.step == 0:
                st.acc = _fresh_acc()
                data.reset_stats()
            data.device_cache_stats()  # count this epoch's training gathers only
            acc = st.acc
            with closing(task.batches(plan, epoch, st.step)) as it:
                while True:
                    batch = loss = None  # released before the next batch is built
                    t_wait = time.perf_counter()
                    batch = next(it, None)
                    t_got = time.perf_counter()
                    if batch is None:
                        break
                    ctx = torch.autocast(device_type=device.type, dtype=amp_dtype) if use_amp \
                        else nullcontext()
                    with ctx:
                        loss, bstats = task.loss(net, batch, device)
                    if not math.isfinite(bstats["loss_value"]):
                        raise DivergedError(
                            f"epoch {epoch}, batch {st.step} (step {st.global_step}): the training "
                            f"loss is {bstats['loss_value']}; the run stops before updating the "
                            f"weights with it (the last checkpoint is kept). Damaged features can "
                            f"cause this: check them with `ooc verify {cfg.dataset}` (a run with "
                            f"--verify structure skips the checksums); else try a lower --lr")
                    opt.zero_grad()
                    if scaler is not None:
                        scaler.scale(loss).backward()
                        scaler.step(opt)
                        scaler.update()
                    else:
                        loss.backward()
                        opt.step()
                    lv = bstats["loss_value"]
                    t_done = time.perf_counter()
                    st.losses.append(lv)
                    acc["loss"] += lv * bstats["seen"]
                    for k in ("seen", "correct", "tp", "err", "edges", "sample_s", "gather_s"):
                        acc[k] += bstats.get(k, 0)
                    acc["stall_s"] += t_got - t_wait
                    acc["compute_s"] += t_done - t_got
                    acc["train_time_s"] += t_done - t_wait
                    st.global_step += 1
                    st.step += 1
                    steps_f.write(json.dumps({
                        "step": st.global_step - 1, "epoch": epoch, "batch": st.step - 1,
                        "t": round(elapsed0 + t_done - t_start, 6), "stall_s": round(t_got - t_wait, 6),
                        "compute_s": round(t_done - t_got, 6), "sample_s": round(bstats.get("sample_s", 0.0), 6),
                        "gather_s": round(bstats.get("gather_s", 0.0), 6), "loss": lv,
                        "seeds": bstats["seen"]}) + "\n")
                    if t_done - last_flush > STEPS_FLUSH_S:
                        steps_f.flush()
                        last_flush = t_done
                    bar.set_postfix(epoch=epoch, loss=f"{lv:.4f}", **data.postfix(), refresh=False)
                    bar.update(1)  # draws the bar (a line at most every 10 s off a terminal)
                    if cfg.checkpoint_every and st.global_step % cfg.checkpoint_every == 0 \
                            and st.step < len(plan.batches):
                        checkpoint()
                    _fault_pause(st.global_step)
                    if stop_after_steps is not None and st.global_step >= stop_after_steps:
                        raise Interrupted(f"stopped after {st.global_step} steps")
            # ---- epoch end: evaluation, record, schedule, early stopping, checkpoint
            cstats = data.device_cache_stats()
            acc = task.epoch_end(acc)  # data-parallel: sums over all ranks
            seen = max(acc["seen"], 1)
            tt = max(acc["train_time_s"], 1e-9)
            rec: dict = {"epoch": epoch, "loss": acc["loss"] / seen, "train_acc": task.train_score(acc),
                         "train_time_s": acc["train_time_s"], "seeds_per_s": acc["seen"] / tt,
                         "edges_per_s": acc["edges"] / tt, "sampled_edges": acc["edges"],
                         "stall_s": acc["stall_s"], "compute_s": acc["compute_s"],
                         "sample_s": acc["sample_s"], "gather_s": acc["gather_s"],
                         "lr": opt.param_groups[0]["lr"], "steps": st.global_step,
                         "train_bytes_read": data.bytes_read_so_far(),
                         "train_read_requests": data.requests_so_far(), **cstats}
            if (epoch + 1) % cfg.eval_every == 0 or epoch == cfg.epochs - 1:
                te = time.perf_counter()
                rss.phase = "evaluation"
                scores = task.evaluate(model, device)
                rss.phase = "epoch end"
                rec.update(scores)
                rec["eval_time_s"] = time.perf_counter() - te
                val = scores[task.select]
                if cfg.early_stop == "score_or_loss":
                    better, progress = _gat_rule(st, val, scores)
                else:
                    better = progress = val > st.best_val
                if better:
                    st.best_val, st.best_test, st.best_epoch = val, scores[task.test_key], epoch
                    _save_atomic(model.state_dict(), out / "model.pt")
                if progress:
                    st.bad_evals = 0
                else:
                    st.bad_evals += 1
                if cfg.patience and st.bad_evals >= cfg.patience:
                    st.stopped_early = True
                if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
                    sched.step(val)
            if sched is not None and not isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
                sched.step()
            io = data.epoch_stats()
            rec.update(io)
            stall = rec.pop("stall_s")  # the loader's view; the loop's own wait is the epoch's
            rec["stall_s"] = acc["stall_s"]
            rec["loader_stall_s"] = stall
            rec.update(job.host_memory())
            rec.update(_machine_memory(job, rec, rss.baseline))
            rec["epoch_time_s"] = time.perf_counter() - t0
            for k in ("bytes_read", "row_hits", "row_misses", "cache_hits", "cache_misses", "swaps",
                      "approx_rows"):
                st.totals[k] = st.totals.get(k, 0) + int(rec.get(k, 0))
            st.history.append(rec)
            with open(metrics_path, "a") as f:
                f.write(json.dumps(rec, sort_keys=True) + "\n")
            msg = (f"epoch {epoch}: loss {rec['loss']:.4f} "
                   + (f"train {rec['train_acc']:.4f} " if rec["train_acc"] is not None else "")
                   + f"{rec['seeds_per_s']:.0f} seeds/s {rec['edges_per_s'] / 1e6:.2f} M edges/s "
                   f"read {rec['bytes_read'] / 2**20:.1f} MiB hit {rec['buffer_hit_ratio']:.3f} "
                   f"stall {rec['stall_s']:.2f}s")
            if cfg.mode != "exact":
                msg += (f" swaps {rec['swaps']} (lower bound {rec.get('swaps_lower_bound')})"
                        if not resumed_at else
                        f" swaps {rec['swaps']} since batch {resumed_at} (lower bound "
                        f"{rec.get('swaps_lower_bound')} for a whole epoch)")
            if rec.get("cache_hits", 0) + rec.get("cache_misses", 0):
                msg += f" cache hit {rec['cache_hit_ratio']:.3f}"
            if task.select in rec:
                msg += f" {task.select} {rec[task.select]:.4f} {task.test_key} {rec[task.test_key]:.4f}"
            if cfg.progress:
                bar.write(msg)
            elif job.is_main:  # without the bar (--no-progress) the epoch lines still print
                print(msg, flush=True)
            log.info(msg)
            st.epoch, st.step = epoch + 1, 0
            if st.stopped_early:
                log.info("early stop after epoch %d: no better %s for %d evaluations", epoch,
                         task.select, cfg.patience)
            checkpoint()
    finally:
        bar.close()
        steps_f.close()
        rss.stop_sampling()
        summary = data.summary()
        task.close()
    history = st.history
    t = st.totals
    metrics = {
        task.test_key: st.best_test,
        task.select: st.best_val,
        "val_score": st.best_val,
        "test_score": st.best_test,
        "metric": task.metric,
        "task": task.name,
        "best_epoch": st.best_epoch,
        "final_test_score": history[-1].get(task.test_key) if history else None,
        "epochs": cfg.epochs,
        "epochs_run": len(history),
        "stopped_early": st.stopped_early,
        "steps": st.global_step,
        "epoch_time_s": [h["epoch_time_s"] for h in history],
        "losses": st.losses,
        "bytes_read": t["bytes_read"],
        "buffer_hit_ratio": t["row_hits"] / max(t["row_hits"] + t["row_misses"], 1),
        "row_hits": t["row_hits"],
        "row_misses": t["row_misses"],
        # per-epoch peaks reset the kernel's high-water mark, which ru_maxrss follows: the run's peak
        # is the larger of the last reading and every epoch's
        "peak_rss_bytes": max([peak_rss_bytes()] + [h.get("peak_rss_bytes", 0) for h in history]),
        "machine_data_peak_bytes": max([h.get("machine_data_peak_bytes", 0) for h in history],
                                       default=0),
        "epoch_peak_rss_bytes": max([h.get("peak_rss_bytes", 0) for h in history], default=0),
        "wall_time_s": elapsed0 + time.perf_counter() - t_start,
        "resumed": ckpt is not None,
        "seed": cfg.seed,
        "config": cfg.to_dict(),
        "history": history,
    }
    metrics.update(summary)
    metrics.update(task.info)
    ch, cm = t.get("cache_hits", 0), t.get("cache_misses", 0)
    metrics.update(cache_hits=ch, cache_misses=cm, cache_hit_ratio=ch / max(ch + cm, 1),
                   swaps=t.get("swaps", 0), approx_rows=t.get("approx_rows", 0))
    if cache is not None:
        hits = sum(h.get("device_cache_hits", 0) for h in history)
        lookups = sum(h.get("device_cache_lookups", 0) for h in history)
        metrics.update(cache.describe(), device_cache_hit_ratio=hits / lookups if lookups else 0.0)
    if job.world_size > 1:
        metrics["distributed"] = dict(job.summary(st.global_step),
                                      shared_buffer=bool(summary["shared_buffer"]))
    if history:
        last = {k: v for k, v in history[-1].items() if k.startswith(("val_", "test_"))}
        best = next((h for h in history if h["epoch"] == st.best_epoch), {})
        metrics.update({k: best[k] for k in best if k.startswith(("val_", "test_"))})
        metrics["final"] = last
    write_json_atomic(out / "metrics.json", metrics)
    ds.close()
    return metrics
