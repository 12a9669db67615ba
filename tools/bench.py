"""``ooc bench convert``: streaming conversion of a binary edge list vs a plain in-memory NumPy build.

The input is an R-MAT ``.npy`` (E, 2) int32 edge list (made once, streamed, if absent).  Each
measured run is a fresh subprocess, so its peak RSS (``ru_maxrss`` from ``wait4``) is its own; the page
cache can be dropped before each run (``--drop-caches``, needs root) so reads come from the disk.

- ``streaming``: ``ooc convert numpy INPUT --num-nodes N --memory-budget B`` (the full conversion:
  validation, CSC build, chunk checksums, source sha256, fsync, atomic rename);
- ``numpy``: ``np.load`` the whole array, ``argsort`` by destination, ``bincount`` + ``cumsum`` for the
  offsets, write indptr/indices with ``np.save`` (no validation, checksums or per-node sorting).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["bench_convert", "run_measured", "doc_help"]

_BASELINE = r"""
import sys, numpy as np
inp, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
e = np.load(inp)                      # whole edge list in memory
src, dst = e[:, 0], e[:, 1]
order = np.argsort(dst, kind="stable")
indices = src[order]
indptr = np.zeros(n + 1, dtype=np.int64)
np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
np.save(out + ".indptr.npy", indptr)
np.save(out + ".indices.npy", indices)
"""


def doc_help(doc: str | None, paragraph: int = 1) -> str | None:
    """Paragraph ``paragraph`` of a module docstring as ``--help`` text: Sphinx roles
    (``:func:`x``` -> ``x``) and double backquotes removed, whitespace folded."""
    if not doc:
        return None
    parts = doc.split("\n\n")
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", parts[min(paragraph, len(parts) - 1)])
    return " ".join(text.replace("``", "").split())


def drop_caches() -> bool:
    """``sync; echo 3 > /proc/sys/vm/drop_caches``; returns False when not permitted."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def run_measured(cmd: list[str]) -> dict:
    """Run ``cmd`` under a tiny wrapper process that reports the command's own peak RSS.

    Returns:
        ``{"seconds", "peak_rss_bytes", "returncode"}``.

    Raises:
        RuntimeError: the command failed (its stderr tail is in the message).
    """
    wrapper = ("import resource, subprocess, sys, json, time\n"
               "t = time.perf_counter()\n"
               "p = subprocess.run(sys.argv[1:], capture_output=True)\n"
               "dt = time.perf_counter() - t\n"
               "ru = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
               "sys.stderr.write(p.stderr.decode()[-3000:])\n"
               "print(json.dumps({'seconds': dt, 'peak_rss_bytes': ru.ru_maxrss * 1024, "
               "'returncode': p.returncode}))\n")
    r = subprocess.run([sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True)
    res = json.loads(r.stdout.strip().splitlines()[-1])
    if res["returncode"] != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr[-2000:]}")
    return res


def bench_convert(edges: int, nodes: int | None = None, workdir: str | Path = "bench-data",
                  memory_budget: str = "2GB", baseline: bool = True, drop: bool = True,
                  seed: int = 0, keep: bool = False, results: str | Path | None = None) -> dict:
    """Benchmark streaming conversion of an ``edges``-edge R-MAT binary edge list.

    Args:
        edges: E; nodes: N (default E / 20, the 1 B-edge / 50 M-node ratio).
        workdir: where the input and outputs go (needs ~ 20 B x E free).
        baseline: also time the in-memory NumPy conversion (needs ~ 30 B x E of memory).
        drop: drop the page cache before each timed run (root only).
        keep: keep the input edge list for later runs.
        results: JSON-lines file the result record is appended to.

    Returns:
        The result record (command lines, seconds, edges/s, peak RSS, machine, date).
    """
    from ooc.ingest.generate import write_rmat_edge_file
    n = int(nodes or max(edges // 20, 1))
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    inp = work / f"rmat-e{edges}-n{n}-s{seed}.npy"
    rec: dict = {"edges": edges, "nodes": n, "input": str(inp), "memory_budget": memory_budget,
                 "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "machine": f"{platform.node()} {os.cpu_count()} cores "
                            f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB "
                            f"{platform.machine()}"}
    if not inp.exists():
        t0 = time.perf_counter()
        tmp = inp.with_suffix(".partial.npy")
        write_rmat_edge_file(tmp, n, edges, seed=seed, progress=sys.stderr.isatty())
        os.replace(tmp, inp)
        rec["input_seconds"] = time.perf_counter() - t0
    rec["input_bytes"] = inp.stat().st_size
    out = work / f"ds-e{edges}"
    cmd = [sys.executable, "-m", "ooc.tools.cli", "convert", "numpy", str(inp), "--out", str(out),
           "--num-nodes", str(n), "--memory-budget", memory_budget, "--overwrite"]
    rec["dropped_caches"] = drop_caches() if drop else False
    r = run_measured(cmd)
    rec["streaming"] = dict(r, command=" ".join(cmd[2:]).replace("ooc.tools.cli", "ooc"),
                            edges_per_s=edges / r["seconds"])
    try:
        man = json.loads(subprocess.run([sys.executable, "-m", "ooc.tools.cli", "info", str(out),
                                         "--json"], capture_output=True, text=True).stdout)["manifest"]
        rec["streaming"]["buckets"] = man["build"]["buckets"]
        rec["streaming"]["phase_seconds"] = man["build"]["seconds"]
    except Exception:  # pragma: no cover - informative only
        pass
    shutil.rmtree(out, ignore_errors=True)
    if baseline:
        base_out = str(work / f"numpy-e{edges}")
        if drop:
            drop_caches()
        r = run_measured([sys.executable, "-c", _BASELINE, str(inp), base_out, str(n)])
        rec["numpy"] = dict(r, command="np.load + argsort(dst) + bincount/cumsum + np.save",
                            edges_per_s=edges / r["seconds"])
        rec["speed_ratio_streaming_over_numpy"] = rec["numpy"]["seconds"] / rec["streaming"]["seconds"]
        rec["rss_ratio_streaming_over_numpy"] = (rec["streaming"]["peak_rss_bytes"] /
                                                 rec["numpy"]["peak_rss_bytes"])
        for suffix in (".indptr.npy", ".indices.npy"):
            Path(base_out + suffix).unlink(missing_ok=True)
    if not keep:
        inp.unlink(missing_ok=True)
    if results:
        with open(results, "a") as f:
            f.write(json.dumps(rec) + "\n")
    return rec
