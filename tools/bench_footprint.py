"""Peak disk, wall time and peak RSS of a command that rewrites a dataset (``ooc partition``).

    python -m ooc.tools.bench_footprint DATASET -- ooc partition DATASET --parts 16 --method stream

A thread sums, every ``--interval`` seconds, the bytes of every file under ``DATASET`` and under its
hidden siblings ``.NAME.*`` (the copy path's ``.NAME.partial-*`` / ``.NAME.old-*``; the lock file is
empty), both apparent (``st_size``) and allocated (``st_blocks`` x 512), while the command runs under
``/usr/bin/time`` (peak RSS).  Prints one JSON object: ``wall_s``, ``maxrss_kb``, ``source_*``,
``peak_*``, ``end_*`` (bytes) and the peak over the source.  Files are counted once per sample by
inode (a walk that meets a folder before and after a rename would count it twice).  A sampler can
miss a peak shorter than its interval; the rewrite's peaks last for a batch of chunks (seconds at
GB scale).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time


def usage(ds: str) -> tuple[int, int]:
    """(apparent, allocated) bytes of ``ds`` and its hidden siblings."""
    parent, name = os.path.dirname(ds), os.path.basename(ds)
    roots = [ds] + [os.path.join(parent, e) for e in os.listdir(parent)
                    if e.startswith(f".{name}.") and not e.endswith(".lock")]
    app = alloc = 0
    seen: set[tuple[int, int]] = set()  # a file renamed while the walk runs is met twice
    for r in roots:
        for dp, _dn, fn in os.walk(r):
            for f in fn:
                try:
                    st = os.stat(os.path.join(dp, f))
                except FileNotFoundError:  # deleted while listed
                    continue
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                app += st.st_size
                alloc += st.st_blocks * 512
    return app, alloc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dataset")
    p.add_argument("--interval", type=float, default=0.05, help="seconds between samples")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    a = p.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    ds = os.path.abspath(a.dataset)
    src = usage(ds)
    peak = list(src)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                x, y = usage(ds)
                peak[0], peak[1] = max(peak[0], x), max(peak[1], y)
            except OSError:
                pass
            time.sleep(a.interval)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    t0 = time.time()
    proc = subprocess.run(["/usr/bin/time", "-f", "MAXRSS_KB %M", *cmd], capture_output=True, text=True)
    wall = time.time() - t0
    stop.set()
    t.join()
    end = usage(ds)
    rss = [ln for ln in proc.stderr.splitlines() if ln.startswith("MAXRSS_KB")]
    sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-2000:])
    print(json.dumps({"rc": proc.returncode, "wall_s": round(wall, 1),
                      "maxrss_kb": int(rss[-1].split()[1]) if rss else None,
                      "source_apparent": src[0], "source_alloc": src[1],
                      "peak_apparent": peak[0], "peak_alloc": peak[1],
                      "end_apparent": end[0], "end_alloc": end[1],
                      "peak_over_source": round(peak[0] / max(src[0], 1), 3)}))
    return proc.returncode


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
