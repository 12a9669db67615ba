"""``ooc bench scale``: the billion-edge pipeline end to end, one measured process per stage.

generate (R-MAT with planted labels, straight into the store) -> partition (streaming Fennel) ->
(``compress``: PQ codes of every row, when the configuration asks for them) -> train ``hybrid``
(one epoch under a memory budget, then sampled evaluation on the validation and test splits) -> train ``buffer`` -> (``--small``: an in-memory ``exact`` run, the accuracy
reference).  Every stage is a fresh ``ooc`` process whose wall time, peak RSS (``ru_maxrss`` from
``wait4``), bytes read from storage (``/proc/PID/io`` ``read_bytes``, polled) and system swap
activity (``/proc/vmstat`` ``pswpin``/``pswpout``) are recorded; the page cache is dropped before
each training stage (root only).  The record is rewritten to ``RESULTS`` (JSON) after every stage,
so an interrupted run keeps the stages it finished, and a rerun skips stages already recorded as
done for the same configuration (``--redo`` forces them).

Full run (1 B edges): ``ooc bench scale --workdir /work/bench-data/scale``.
Small variant (~10 M edges, under 10 minutes on 2 cores): ``ooc bench scale --small``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ooc.tools.bench import doc_help, drop_caches
from ooc.tools.bench_footprint import usage
from ooc.tools.options import SizeAction

__all__ = ["ScaleConfig", "run_scale", "format_table", "add_bench_scale"]


@dataclass
class ScaleConfig:
    """Sizes and options of one pipeline run.

    Attributes:
        nodes, edges: N and E (directed R-MAT edges, not symmetrised).
        feat_dim, classes: feature width D (stored as ``feat_dtype``) and K planted classes.
        splits: train / valid / test fractions of the nodes.
        parts: partitions of the streaming partitioner.
        budget: training memory budget (``--memory-budget``), e.g. ``"8GB"``; empty: no byte
            budget, ``buffer_parts`` resident partitions (``--buffer-partitions``).
        prefetch: batches built ahead (each counts in the budget's batches in flight).
        gen_budget, part_budget: memory budgets of generate and partition.
        edge_buckets: let ``ooc partition`` write ``partitions/buckets/*`` (2 x the indices on
            disk; only link prediction's BETA ordering reads them, node training does not).
        fanouts, batch_size, hidden, epochs: GraphSAGE training options (3 layers for 3 fanouts).
        eval_fanouts: sampled evaluation fanouts (full neighbourhoods explode on R-MAT).
        modes: training modes run in order (``hybrid``, ``buffer``, ``exact``, ``auto``: hybrid with
            the automatic budget split under ``auto_budget``; ``exact`` runs with
            everything in memory, as the accuracy reference).
        topology: ``--topology`` of the budgeted runs (``disk``: only indptr in memory).
        compress_subspaces: M of a ``compress`` stage after partitioning (``ooc compress
            --subspaces M``: M bytes of PQ codes per node, which ``--miss-features auto|pq``
            trains with); 0: no such stage.
        checkpoint_every: ``--checkpoint-every`` of the training stages (0: none).  With
            checkpoints, a training stage that was interrupted (its process killed, the machine
            lent for a shorter time than the epoch takes) continues with ``ooc train --resume``
            when the benchmark is run again; the stage records each segment.
    """

    nodes: int = 50_000_000
    edges: int = 1_000_000_000
    feat_dim: int = 128
    classes: int = 20
    feat_dtype: str = "float16"
    splits: tuple[float, float, float] = (0.011, 0.0022, 0.0022)
    parts: int = 64
    budget: str = "8GB"
    buffer_parts: int = 4
    prefetch: int = 1
    gen_budget: str = "2GB"
    part_budget: str = "2GB"
    edge_buckets: bool = False
    fanouts: str = "15,10,5"
    eval_fanouts: str = "15,10,5"
    batch_size: int = 1024
    hidden: int = 64
    epochs: int = 1
    modes: tuple[str, ...] = ("hybrid", "buffer")
    topology: str = "disk"
    auto_budget: str = ""
    seed: int = 0
    checkpoint_every: int = 0
    compress_subspaces: int = 0
    extra_train_args: list[str] = field(default_factory=list)

    @classmethod
    def small(cls) -> "ScaleConfig":
        """The ~10 M-edge variant: 500 K nodes, 10 M edges, the same generator and model, 16
        partitions of which 4 resident, plus the in-memory reference.

        Hybrid and buffer run with ``--buffer-partitions`` (4 resident), not a byte budget; the
        ``auto`` stage trains hybrid under ``auto_budget`` with the automatic split (topology,
        slots and row cache chosen by :mod:`ooc.data.autoplan`, batches sized by its probe)."""
        return cls(nodes=500_000, edges=10_000_000, splits=(0.05, 0.01, 0.01), parts=16,
                   budget="", buffer_parts=4, gen_budget="512MB", part_budget="256MB",
                   modes=("hybrid", "buffer", "exact", "auto"), auto_budget="600MB")

    @classmethod
    def papers100m(cls) -> "ScaleConfig":
        """ogbn-papers100M's shape: 111,059,956 nodes, 1,615,685,872 directed edges, 128-d
        features (float16 here), 172 classes and its split sizes (1,207,179 / 125,265 / 214,338
        nodes as fractions); generated under 4 GB (the degree arrays alone are 2.2 GB), partitioned
        under 6 GB (its node-sized index arrays are 4 GB), 128 stream partitions; trained in
        hybrid mode with the automatic split under 8 GB (topology, hot lists, slots, row cache),
        O_DIRECT reads (the page cache would otherwise hold a share of the 36 GB dataset), no
        dropout (with 0.5 on every layer's input, 172 planted classes of noisy 128-d rows stay at
        the uniform loss ln 172 for the first 120 steps of a 300 K-node graph; with none, test
        accuracy 0.84 after them), a checkpoint every 100 steps (an epoch is longer than many
        machines are lent for), and 16-byte PQ codes of every row that the split may use for the
        outermost hop's misses (``--miss-features auto``): with 11 of 128 partitions resident,
        the rows read from disk were ~70% of a step."""
        n = 111_059_956
        return cls(nodes=n, edges=1_615_685_872, classes=172,
                   splits=(1_207_179 / n, 125_265 / n, 214_338 / n), parts=128,
                   gen_budget="4GB", part_budget="6GB", modes=("auto",), auto_budget="8GB",
                   checkpoint_every=100, compress_subspaces=16,
                   extra_train_args=["--direct-io", "--dropout", "0", "--miss-features", "auto"])


def _read_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _vmstat_swaps() -> int:
    n = 0
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                k, v = line.split()
                if k in ("pswpin", "pswpout"):
                    n += int(v)
    except OSError:
        pass
    return n


def _die_with_parent() -> None:
    """``preexec_fn`` of a stage: the stage gets SIGTERM when this orchestrator dies (Linux
    ``PR_SET_PDEATHSIG``), so no orphan keeps a run directory locked for the next invocation."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: orphans are possible
        pass


def run_stage(cmd: list[str], log_path: Path, poll_s: float = 1.0, disk: Path | None = None,
              disk_every_s: float = 1.0) -> dict:
    """Run ``cmd`` with stdout/stderr to ``log_path`` and measure it.

    With ``disk`` (a dataset path), the bytes of it and its hidden siblings (a rewrite's partial
    and old copies; :func:`ooc.tools.bench_footprint.usage`) are summed every ``disk_every_s``
    seconds: ``disk_start_bytes``, ``disk_peak_bytes`` and ``disk_end_bytes`` join the result (a
    peak shorter than the interval can be missed).

    Returns:
        ``{"command", "seconds", "peak_rss_bytes", "read_bytes", "system_swaps", "returncode"}`` —
        ``peak_rss_bytes`` is ``ru_maxrss``, which also counts the parent's pages between fork and
        exec (this orchestrator imports neither torch nor Numba: ~30 MB); ``read_bytes`` is the last ``/proc/PID/io`` value seen (storage reads of the process,
        page-cache hits excluded; polled every ``poll_s`` s, so up to ``poll_s`` of reads at the
        end may be missing), ``system_swaps`` the system's pages swapped in + out meanwhile (the
        training stages' ``swaps`` are the engine's partition swaps).
    """
    sw0 = _vmstat_swaps()
    disk_bytes = (lambda: usage(str(disk))[0]) if disk is not None else None
    d0 = disk_bytes() if disk_bytes else 0
    dpeak, next_disk = d0, time.perf_counter() + disk_every_s
    t0 = time.perf_counter()
    with open(log_path, "w") as logf:
        p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                             preexec_fn=_die_with_parent)
        rb = 0
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            v = _read_bytes(p.pid)
            rb = v if v is not None else rb
            if disk_bytes and time.perf_counter() >= next_disk:
                dpeak = max(dpeak, disk_bytes())
                next_disk = time.perf_counter() + disk_every_s
            time.sleep(poll_s)
    p.returncode = os.waitstatus_to_exitcode(status)
    out = {"command": " ".join(cmd), "seconds": time.perf_counter() - t0,
           "peak_rss_bytes": ru.ru_maxrss * 1024, "read_bytes": rb,
           "system_swaps": _vmstat_swaps() - sw0, "returncode": p.returncode}
    if disk_bytes:
        end = disk_bytes()
        out.update(disk_start_bytes=d0, disk_peak_bytes=max(dpeak, end), disk_end_bytes=end)
    return out


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


def kill_at_step(cmd: list[str], steps_path: Path, step: int, log_path: Path,
                 poll_s: float = 0.5) -> dict:
    """Run ``cmd`` (a training command) and SIGKILL it once ``steps_path`` (its ``steps.jsonl``)
    holds ``step`` records — a real, unannounced kill at an arbitrary point of the step after.

    Returns:
        ``{"killed_after_steps", "seconds", "returncode"}``; ``returncode`` is ``-9`` when the kill
        landed, the process's own exit code when it ended first.
    """
    t0 = time.perf_counter()
    with open(log_path, "w") as logf:
        p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                             preexec_fn=_die_with_parent)
        seen = 0
        while p.poll() is None:
            seen = _count_lines(steps_path)
            if seen >= step:
                p.send_signal(signal.SIGKILL)
                p.wait()
                break
            time.sleep(poll_s)
    return {"killed_after_steps": seen, "seconds": time.perf_counter() - t0,
            "returncode": p.returncode}


def compare_runs(a: Path, b: Path) -> dict:
    """Compare two finished training runs: final weights (``checkpoint.pt``, in a subprocess so this
    orchestrator stays free of torch), per-step losses and the test / validation scores.

    Returns:
        ``{"identical_weights", "identical_losses", "same_test_acc", "same_val_acc", "steps"}``.
    """
    ma = json.loads((a / "metrics.json").read_text())
    mb = json.loads((b / "metrics.json").read_text())
    code = ("import sys, torch\nfrom ooc.training.checkpoint import load_checkpoint\n"
            "w = [load_checkpoint(f)['model'] for f in sys.argv[1:]]\n"
            "print(int(w[0].keys() == w[1].keys() and all(torch.equal(w[0][k], w[1][k]) for k in w[0])))")
    out = subprocess.run([sys.executable, "-c", code, str(a / "checkpoint.pt"), str(b / "checkpoint.pt")],
                         capture_output=True, text=True)
    return {"identical_weights": out.stdout.strip() == "1",
            "identical_losses": ma.get("losses") == mb.get("losses"),
            "same_test_acc": ma.get("test_acc") == mb.get("test_acc"),
            "same_val_acc": ma.get("val_acc") == mb.get("val_acc"),
            "steps": [ma.get("steps"), mb.get("steps")]}


#: Training stages ``train-MODE`` of :func:`run_scale`.
TRAIN_MODES = ("hybrid", "buffer", "exact", "auto")


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _ooc(*args: str) -> list[str]:
    return [sys.executable, "-m", "ooc.tools.cli", *args]


def _train_metrics(run: Path) -> dict:
    """The figures of a training run directory (metrics.json + the last epoch of metrics.jsonl)."""
    m = json.loads((run / "metrics.json").read_text())
    hist = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    last = hist[-1] if hist else {}
    keep = ("test_acc", "val_acc", "bytes_read", "buffer_hit_ratio", "cache_hit_ratio", "swaps",
            "row_hits", "row_misses", "peak_rss_bytes", "rss_baseline_bytes", "budget",
            "resident_partitions", "num_parts", "direct_io", "buffer_bytes", "cache_bytes",
            "topology", "split", "miss_features")
    out = {k: m[k] for k in keep if k in m}
    for k in ("train_time_s", "eval_time_s", "seeds_per_s", "edges_per_s", "sampled_edges",
              "stall_s", "compute_s", "sample_s", "gather_s", "loss", "train_acc", "steps",
              "topology_bytes_read", "swaps_lower_bound", "planned_swaps", "buffer_states",
              "load_bandwidth_Bps", "bytes_read_loads"):
        if k in last:
            out["epoch_" + k if k in ("bytes_read_loads",) else k] = last[k]
    if "train_time_s" in out and out["train_time_s"]:
        out["stall_fraction"] = out.get("stall_s", 0.0) / out["train_time_s"]
    return out


def _train_cmd(cfg: ScaleConfig, ds: Path, mode: str, run: Path) -> list[str]:
    cmd = _ooc("train", str(ds), "--model", "sage", "--fanout", cfg.fanouts,
               "--eval-fanout", cfg.eval_fanouts, "--batch-size", str(cfg.batch_size),
               "--eval-batch-size", str(cfg.batch_size), "--hidden", str(cfg.hidden),
               "--epochs", str(cfg.epochs), "--partitions", str(cfg.parts),
               "--seed", str(cfg.seed), "--no-progress", "--output-dir", str(run))
    if mode == "exact":  # the in-memory reference: everything resident
        cmd += ["--mode", "exact", "--memory-budget", "1TB", "--topology", "memory"]
    elif mode == "auto":  # hybrid, the automatic budget split
        cmd += ["--mode", "hybrid", "--topology", "auto", "--memory-budget",
                cfg.auto_budget or cfg.budget or "8GB"]
    else:
        cmd += ["--mode", mode, "--topology", cfg.topology]
        cmd += (["--memory-budget", cfg.budget] if cfg.budget else
                ["--buffer-partitions", str(cfg.buffer_parts)])
    if cfg.checkpoint_every and mode != "exact":
        cmd += ["--checkpoint-every", str(cfg.checkpoint_every)]
    return cmd + ["--prefetch", str(cfg.prefetch), *cfg.extra_train_args]


def run_kill_resume(cfg: ScaleConfig, work: Path, mode: str, kill_step: int, every: int,
                    drop: bool = True) -> dict:
    """The interruption check: train ``mode`` again into ``runs/MODE-resume`` with
    ``--checkpoint-every EVERY``, SIGKILL it after ``kill_step`` steps, ``--resume`` it, and compare
    the result with the uninterrupted ``runs/MODE`` (which must exist).

    Returns:
        ``{"command", "kill": {...}, "resume": run_stage figures, "compare": compare_runs(...),
        "returncode"}`` (``returncode`` 0 only when the kill landed and the resume finished).

    Raises:
        FileNotFoundError: ``runs/MODE/metrics.json`` is missing (run ``train-MODE`` first).
    """
    ref = work / "runs" / mode
    if not (ref / "metrics.json").exists():
        raise FileNotFoundError(f"{ref / 'metrics.json'}: run the train-{mode} stage first")
    run = work / "runs" / f"{mode}-resume"
    shutil.rmtree(run, ignore_errors=True)
    cmd = _train_cmd(cfg, work / "DS", mode, run) + ["--checkpoint-every", str(every)]
    if drop:
        drop_caches()
    kill = kill_at_step(cmd, run / "steps.jsonl", kill_step, work / "logs" / f"resume-{mode}-killed.log")
    out: dict = {"command": " ".join(cmd).replace(f"{sys.executable} -m ooc.tools.cli", "ooc"),
                 "kill": kill, "checkpoint_every": every}
    if kill["returncode"] != -signal.SIGKILL:
        out["returncode"] = 1
        if kill["returncode"] == 0:
            out["why"] = (f"the run finished in {_count_lines(run / 'steps.jsonl')} steps, before the kill "
                          f"after step {kill_step} (--kill-resume {mode}:STEP with a smaller STEP)")
        return out
    if drop:
        drop_caches()
    r = run_stage(_ooc("train", "--resume", str(run), "--no-progress"),
                  work / "logs" / f"resume-{mode}.log")
    out["resume"] = r
    out["returncode"] = r["returncode"]
    if r["returncode"] == 0:
        out["compare"] = compare_runs(ref, run)
        m = _train_metrics(run)
        out["test_acc"], out["val_acc"] = m.get("test_acc"), m.get("val_acc")
    return out


#: The configuration fields each stage's result depends on; a stage recorded under another
#: configuration is kept when these are equal (another training budget does not regenerate the
#: dataset).  Training stages depend on every field.
_GENERATE_FIELDS = ("nodes", "edges", "feat_dim", "classes", "feat_dtype", "splits", "gen_budget",
                    "seed")
_PARTITION_FIELDS = _GENERATE_FIELDS + ("parts", "part_budget", "edge_buckets")
_COMPRESS_FIELDS = _PARTITION_FIELDS + ("compress_subspaces",)


def _stages_still_valid(old: dict, conf: dict) -> dict:
    """The stages of the record ``old`` that hold for the configuration ``conf`` (see
    ``_GENERATE_FIELDS``): all of them when the configurations are equal, else generate and
    partition (and compress) while their fields agree (each only after the one before)."""
    conf = json.loads(json.dumps(conf))
    prev, stages = json.loads(json.dumps(old.get("config") or {})), old.get("stages") or {}
    if prev == conf:
        return stages
    keep: dict = {}
    for st, fields in (("generate", _GENERATE_FIELDS), ("partition", _PARTITION_FIELDS),
                       ("compress", _COMPRESS_FIELDS)):
        if st not in stages or any(prev.get(f) != conf.get(f) for f in fields):
            break
        keep[st] = stages[st]
    return keep


def _interrupted_segments(prev: dict, run: Path) -> list[dict]:
    """The segments of an interrupted training stage.  When the orchestrator died with it (``prev``
    is the marker, returncode None) the last one is closed from the run's files: its useful time
    ends at the last checkpoint (steps after it are trained again), its last step at
    ``steps.jsonl``'s modification time; a segment that failed is recorded as it ended."""
    segs = [dict(x) for x in prev.get("segments", [])]
    if prev.get("returncode") is not None:  # the last segment failed and is recorded
        return segs
    t0 = float(prev["started_unix"])
    ck = (run / "checkpoint.pt").stat().st_mtime
    steps = run / "steps.jsonl"
    last = steps.stat().st_mtime if steps.exists() else ck
    segs.append({"date": prev.get("date"), "interrupted": True, "seconds": max(0.0, ck - t0),
                 "seconds_to_last_step": max(0.0, last - t0), "steps_seen": _count_lines(steps)})
    return segs


def run_scale(cfg: ScaleConfig, workdir: str | Path, results: str | Path | None = None,
              drop: bool = True, redo: bool = False, keep: bool = True,
              stages: tuple[str, ...] | None = None,
              kill_resume: tuple[str, int, int] | None = None) -> dict:
    """Run the pipeline of ``cfg`` in ``workdir`` and return (and write) the record.

    Args:
        cfg: sizes and options.
        workdir: dataset ``DS`` and run directories ``runs/MODE`` go here; each stage's output
            goes to ``logs/STAGE.log``.
        results: JSON file of the record (default ``workdir/scale.json``), rewritten per stage.
        drop: drop the page cache before each training stage (needs root; recorded).
        redo: rerun the selected stages even when the results file holds them for this
            configuration (the other stages' records are kept).
        keep: keep the dataset at the end (``False``: delete it).
        stages: subset of ``generate``, ``partition``, ``train-MODE``, ``resume-MODE`` to run
            (default: all).
        kill_resume: ``(MODE, STEP, EVERY)`` adds the stage ``resume-MODE`` after the training
            stages: :func:`run_kill_resume` (SIGKILL after STEP steps, resume, compare).

    Returns:
        ``{"config", "machine", "date", "stages": {name: figures}, "dataset_bytes", ...}``.

    Raises:
        RuntimeError: a stage failed (its log is named; earlier stages stay recorded).
    """
    work = Path(workdir)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    res_path = Path(results) if results else work / "scale.json"
    conf = asdict(cfg)
    rec: dict = {"config": conf, "stages": {}}
    if res_path.exists():
        rec["stages"] = _stages_still_valid(json.loads(res_path.read_text()), conf)
    rec["machine"] = (f"{platform.node()} {os.cpu_count()} cores "
                      f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB "
                      f"{platform.machine()}")
    ds = work / "DS"
    all_stages = ["generate", "partition", *(["compress"] if cfg.compress_subspaces else []),
                  *[f"train-{m}" for m in cfg.modes]]
    if kill_resume:
        all_stages.append(f"resume-{kill_resume[0]}")
    todo = [s for s in all_stages if stages is None or s in stages]

    def save() -> None:
        tmp = res_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec, indent=1))
        os.replace(tmp, res_path)

    for st in todo:
        if st in rec["stages"] and rec["stages"][st].get("returncode") == 0 and not redo:
            continue
        date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        if st.startswith("resume-") and kill_resume:
            r = run_kill_resume(cfg, work, kill_resume[0], kill_resume[1], kill_resume[2], drop=drop)
            res = r.get("resume", {})
            r.update(date=date, seconds=r["kill"]["seconds"] + res.get("seconds", 0.0),
                     peak_rss_bytes=res.get("peak_rss_bytes", 0), read_bytes=res.get("read_bytes"))
            rec["stages"][st] = r
            save()
            if r["returncode"] != 0:
                if r.get("why"):
                    raise RuntimeError(f"stage {st}: {r['why']}")
                log = work / "logs" / (f"resume-{kill_resume[0]}.log" if res else
                                       f"resume-{kill_resume[0]}-killed.log")
                raise RuntimeError(f"stage {st} failed (kill {r['kill']['returncode']}, resume "
                                   f"{res.get('returncode')}); see {log}")
            continue
        if st == "generate":
            cmd = _ooc("generate", "rmat", "--nodes", str(cfg.nodes), "--edges", str(cfg.edges),
                       "--feat-dim", str(cfg.feat_dim), "--classes", str(cfg.classes),
                       "--feat-dtype", cfg.feat_dtype, "--splits", ",".join(map(str, cfg.splits)),
                       "--memory-budget", cfg.gen_budget, "--seed", str(cfg.seed), "--out", str(ds),
                       "--overwrite")
        elif st == "partition":
            cmd = _ooc("partition", str(ds), "--parts", str(cfg.parts), "--method", "stream",
                       "--memory-budget", cfg.part_budget, "--seed", str(cfg.seed))
            if not cfg.edge_buckets:
                cmd.append("--no-edge-buckets")
        elif st == "compress":
            cmd = _ooc("compress", str(ds), "--subspaces", str(cfg.compress_subspaces),
                       "--seed", str(cfg.seed), "--overwrite", "--no-progress")
        segments: list[dict] = []
        log_name = st
        if st.startswith("train-"):
            mode = st.split("-", 1)[1]
            run = work / "runs" / mode
            prev = rec["stages"].get(st, {})
            if cfg.checkpoint_every and prev.get("started_unix") and prev.get("returncode") != 0 \
                    and (run / "checkpoint.pt").exists():
                segments = _interrupted_segments(prev, run)
                cmd = _ooc("train", "--resume", str(run), "--no-progress")
                log_name = f"{st}-resume{len(segments)}"
            else:
                shutil.rmtree(run, ignore_errors=True)
                cmd = _train_cmd(cfg, ds, mode, run)
            # a marker, so that a run killed with this orchestrator is resumed next time (its
            # start is this segment's: an interrupted segment is timed from it)
            rec["stages"][st] = {"date": date, "started_unix": time.time(),
                                 "segments": segments, "returncode": None}
            save()
        dropped = drop_caches() if drop and st.startswith("train") else False
        r = run_stage(cmd, work / "logs" / f"{log_name}.log",
                      disk=ds if st in ("generate", "partition", "compress") else None)
        r["command"] = r["command"].replace(f"{sys.executable} -m ooc.tools.cli", "ooc")
        r.update(date=date, dropped_caches=dropped)
        if st.startswith("train-") and cfg.checkpoint_every:  # figures cover every segment
            seg = {k: r[k] for k in ("date", "seconds", "peak_rss_bytes", "read_bytes", "command",
                                     "returncode")}
            segments.append(seg)
            r["segments"] = segments
            r["started_unix"] = rec["stages"][st]["started_unix"]  # a failed one resumes too
            r["seconds"] = sum(x.get("seconds", 0.0) for x in segments)
            r["peak_rss_bytes"] = max(x.get("peak_rss_bytes", 0) for x in segments)
            r["read_bytes"] = sum(x.get("read_bytes") or 0 for x in segments)
        if r["returncode"] == 0:
            if st in ("generate", "partition", "compress"):
                r["dataset_bytes"] = _du(ds)
                info = json.loads(subprocess.run(_ooc("info", str(ds), "--json"), capture_output=True,
                                                 text=True).stdout or "{}")
                man = info.get("manifest", {})
                r["num_nodes"] = man.get("num_nodes")
                r["num_edges"] = man.get("directed_edges")
                if st == "partition":
                    r["partitioning"] = man.get("partitioning")
                elif st == "compress":
                    r["pq"] = man.get("pq")
                else:
                    r["build"] = man.get("build")
                    r["edges_per_s"] = cfg.edges / r["seconds"]
            else:
                r.update(_train_metrics(work / "runs" / st.split("-", 1)[1]))
        rec["stages"][st] = r
        save()
        if r["returncode"] != 0:
            again = (" (run the same command again to resume it from its checkpoint)"
                     if r.get("started_unix") and (work / "runs" / st.split("-", 1)[1] /
                                                   "checkpoint.pt").exists() else "")
            raise RuntimeError(f"stage {st} failed (exit {r['returncode']}); see "
                               f"{work / 'logs' / (log_name + '.log')}{again}")
    if ds.exists():
        rec["dataset_bytes"] = _du(ds)
    if not keep:
        shutil.rmtree(ds, ignore_errors=True)
    save()
    return rec


def _gib(b: float | None) -> str:
    return "–" if b is None else f"{b / 2**30:.2f}"


def format_table(rec: dict) -> str:
    """A plain-text table of the record's stages (wall s, peak RSS GiB, GiB read, accuracy...)."""
    rows = [("stage", "wall s", "peak RSS GiB", "read GiB", "sys swaps", "notes")]
    for name, r in rec["stages"].items():
        notes = ""
        if name in ("generate", "partition", "compress"):
            notes = f"dataset {_gib(r.get('dataset_bytes'))} GiB"
            if name == "generate" and r.get("edges_per_s"):
                notes += f", {r['edges_per_s'] / 1e6:.2f} M edges/s"
            if name == "partition" and r.get("partitioning"):
                p = r["partitioning"]
                notes += f", cut {p.get('cut_fraction', float('nan')):.3f}" if "cut_fraction" in p else ""
            if name == "compress" and r.get("pq"):
                notes += (f", {r['pq'].get('bytes_per_node')} B per node, relative error "
                          f"{r['pq'].get('relative_error', float('nan')):.3f}")
            if r.get("disk_peak_bytes"):
                notes += (f", disk peak {_gib(r['disk_peak_bytes'])} GiB "
                          f"({r['disk_peak_bytes'] / max(r.get('dataset_bytes') or 1, 1):.2f}x the result)")
        elif "train_time_s" in r:
            notes = (f"epoch {r['train_time_s']:.1f} s, eval {r.get('eval_time_s', 0):.1f} s, "
                     f"{r.get('seeds_per_s', 0):.0f} seeds/s, "
                     f"{r.get('edges_per_s', 0) / 1e6:.2f} M edges/s, stall "
                     f"{r.get('stall_fraction', 0):.2f}, hit {r.get('buffer_hit_ratio', 0):.3f}, "
                     f"cache {r.get('cache_hit_ratio', 0):.3f}, swaps {r.get('swaps', 0)}, "
                     f"test {r.get('test_acc', float('nan')):.4f}")
        elif name.startswith("resume-") and "kill" in r:
            c = r.get("compare", {})
            notes = (f"SIGKILL after {r['kill'].get('killed_after_steps')} steps, resumed: weights "
                     f"{'identical' if c.get('identical_weights') else 'DIFFER'}, losses "
                     f"{'identical' if c.get('identical_losses') else 'DIFFER'}, test "
                     f"{r.get('test_acc') if r.get('test_acc') is not None else float('nan'):.4f}")
        if len(r.get("segments") or []) > 1:
            notes += f"; {len(r['segments'])} segments (interrupted, then --resume)"
        if r.get("returncode"):
            notes = f"FAILED (exit {r['returncode']})"
        if "seconds" not in r:  # the marker of a training stage still running or interrupted
            rows.append((name, "-", "-", "-", "", "started " + str(r.get("date", "")) +
                         ", not finished (run again to resume)"))
            continue
        rows.append((name, f"{r['seconds']:.1f}", _gib(r["peak_rss_bytes"]), _gib(r.get("read_bytes")),
                     str(r.get("system_swaps", r.get("swaps", "")) if name in ("generate", "partition", "compress")
                         else r.get("system_swaps", "")),
                     notes))
    w = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w[i]) for i, c in enumerate(row)).rstrip() for row in rows)


def _cmd_bench_scale(args: argparse.Namespace) -> int:
    from ooc.tools.cli import _count  # type: ignore[attr-defined]
    if args.small and args.papers100m:
        print("ooc bench scale: --small and --papers100m are two sizes; give one", file=sys.stderr)
        return 2
    cfg = (ScaleConfig.small() if args.small else ScaleConfig.papers100m() if args.papers100m
           else ScaleConfig())
    for k in ("nodes", "edges"):
        v = getattr(args, k)
        if v is not None:
            setattr(cfg, k, _count(v) if isinstance(v, str) else v)
    for k in ("parts", "feat_dim", "classes", "hidden", "batch_size", "buffer_parts", "prefetch",
              "checkpoint_every", "compress_subspaces"):
        v = getattr(args, k)
        if v is not None:
            setattr(cfg, k, v)
    for k in ("budget", "gen_budget", "part_budget", "fanouts", "eval_fanouts", "topology",
              "auto_budget"):
        v = getattr(args, k)
        if v is not None:
            setattr(cfg, k, v)
    if args.modes:
        cfg.modes = tuple(args.modes.split(","))
    bad = [m for m in cfg.modes if m not in TRAIN_MODES]
    if bad or (cfg.checkpoint_every or 0) < 0 or cfg.compress_subspaces < 0:
        why = (f"--modes {args.modes}: {', '.join(bad)} is not one of {', '.join(TRAIN_MODES)}" if bad
               else f"--checkpoint-every {cfg.checkpoint_every}: steps must be >= 0"
               if (cfg.checkpoint_every or 0) < 0
               else f"--compress-subspaces {cfg.compress_subspaces}: must be >= 0 (0: no compress stage)")
        print(f"ooc bench scale: {why}", file=sys.stderr)
        return 2
    if args.splits:
        cfg.splits = tuple(float(x) for x in args.splits.split(","))  # type: ignore[assignment]
    work = Path(args.workdir or "/work/bench-data/scale/" + (
        "small" if args.small else "papers100m" if args.papers100m else "full"))
    stages = tuple(args.stages.split(",")) if args.stages else None
    known = {"generate", "partition", *(["compress"] if cfg.compress_subspaces else []),
             *(f"train-{m}" for m in cfg.modes),
             *(f"resume-{m}" for m in TRAIN_MODES)}
    if stages and set(stages) - known:
        print(f"ooc bench scale: --stages: {', '.join(sorted(set(stages) - known))} is not a stage "
              f"of this run ({', '.join(sorted(known))})", file=sys.stderr)
        return 2
    kr = None
    if args.kill_resume:
        try:
            m, step, every = (args.kill_resume.split(":") + ["0"])[:3]
            kr = (m, int(step), int(every) or max(1, int(step) // 2))
        except ValueError:
            print(f"ooc bench scale: --kill-resume {args.kill_resume!r}: expected MODE:STEP[:EVERY]",
                  file=sys.stderr)
            return 2
    elif args.small and "buffer" in cfg.modes:  # the default interruption check needs its run
        kr = ("buffer", 20, 8)
    try:
        rec = run_scale(cfg, work, args.results, drop=not args.no_drop_caches, redo=args.redo,
                        keep=not args.delete, stages=stages, kill_resume=kr)
    except RuntimeError as e:
        print(f"ooc bench scale: {e}", file=sys.stderr)
        res = Path(args.results) if args.results else work / "scale.json"
        if res.exists():
            print(format_table(json.loads(res.read_text())))
        return 1
    print(format_table(rec))
    return 0


def add_bench_scale(bsub: argparse._SubParsersAction) -> None:
    """Register ``ooc bench scale`` on the subparsers of ``ooc bench``."""
    p = bsub.add_parser("scale", help="billion-edge pipeline: generate, partition, train, evaluate",
                        description=doc_help(__doc__))
    p.add_argument("--small", action="store_true",
                   help="the ~10 M-edge variant (500 K nodes, 16 partitions, 4 resident without a "
                        "byte budget, auto under 600MB, + the in-memory reference)")
    p.add_argument("--papers100m", action="store_true",
                   help="ogbn-papers100M's shape: 111 M nodes, 1.6 B edges, 128-d float16, 172 "
                        "classes, its split sizes, 128 partitions; hybrid with the automatic split "
                        "under 8GB, O_DIRECT, a checkpoint every 100 steps. Needs ~37 GB of disk "
                        "for the dataset and ~46 GB while partitioning in place")
    p.add_argument("--workdir", help="default /work/bench-data/scale/{full,small,papers100m}")
    p.add_argument("--results", help="JSON record (default WORKDIR/scale.json)")
    p.add_argument("--nodes")
    p.add_argument("--edges")
    p.add_argument("--parts", type=int)
    p.add_argument("--feat-dim", type=int)
    p.add_argument("--classes", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--splits", help="train,valid,test fractions")
    p.add_argument("--budget", action=SizeAction, empty=True,
                   help="training --memory-budget (default 8GB; small and '': none, --buffer-parts "
                        "resident partitions)")
    p.add_argument("--buffer-parts", type=int, help="resident partitions without a byte budget")
    p.add_argument("--prefetch", type=int, help="batches built ahead (default 1)")
    p.add_argument("--checkpoint-every", type=int,
                   help="checkpoint the training stages every N steps; an interrupted stage "
                        "continues with --resume when the benchmark is run again")
    p.add_argument("--gen-budget", action=SizeAction)
    p.add_argument("--part-budget", action=SizeAction)
    p.add_argument("--fanouts")
    p.add_argument("--eval-fanouts")
    p.add_argument("--topology", choices=["auto", "memory", "mmap", "disk"])
    p.add_argument("--auto-budget", action=SizeAction, empty=True,
                   help="--memory-budget of the `auto` mode (hybrid, automatic split; default the "
                        "training budget)")
    p.add_argument("--modes", help="comma-separated training modes among hybrid, buffer, exact, "
                                   "auto (default hybrid,buffer; --small: all four; --papers100m: auto)")
    p.add_argument("--compress-subspaces", type=int,
                   help="add stage compress after partition: `ooc compress --subspaces M` (M bytes "
                        "of PQ codes per node; 0: none; default 0, --papers100m: 16)")
    p.add_argument("--stages", help="only these stages, e.g. generate,partition")
    p.add_argument("--kill-resume", metavar="MODE:STEP[:EVERY]",
                   help="add stage resume-MODE: train MODE again with --checkpoint-every EVERY "
                        "(default STEP/2), SIGKILL it after STEP steps, --resume it and compare "
                        "weights, losses and accuracy with the uninterrupted run (--small: "
                        "buffer:20:8)")
    p.add_argument("--redo", action="store_true", help="rerun stages already recorded")
    p.add_argument("--delete", action="store_true", help="delete the dataset at the end")
    p.add_argument("--no-drop-caches", action="store_true")
    p.set_defaults(func=_cmd_bench_scale)
