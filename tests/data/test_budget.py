"""ooc.data.budget: the RSS monitor's peaks."""

from __future__ import annotations

import numpy as np

from ooc.data.budget import RssMonitor


def test_the_peak_names_the_phase_it_was_reached_in() -> None:
    """The sampled private peak keeps the phase and time in which it rose last; a lower reading
    later (memory freed) does not move it, and a reset starts over in the current phase."""
    m = RssMonitor()
    m.phase = "start-up"
    m.peak_private()
    m.phase = "evaluation"
    big = np.ones(96 << 20, dtype=np.uint8)  # 96 MiB touched: above anything before
    high = m.peak_private()
    assert high >= 96 << 20
    del big
    m.phase = "epoch end"
    assert m.peak_private() == high
    phase, seconds = m.peak_private_where()
    assert phase == "evaluation" and seconds >= 0.0
    m.reset_peak()
    assert m.peak_private_where()[0] == "epoch end"


def test_the_peak_rss_is_the_process_own_not_its_parents() -> None:
    """A program started from a process holding 600 MB reports its own peak (VmHWM), where
    ``ru_maxrss`` also keeps the parent's pages copied between fork and exec."""
    import subprocess
    import sys
    child = ("import resource; from ooc.data.budget import high_water_bytes; "
             "print(high_water_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    parent = ("import subprocess, sys, numpy as np; x = np.ones(600 * 2**20 // 8); "
              f"print(subprocess.run([sys.executable, '-c', {child!r}], capture_output=True, "
              "text=True, check=True).stdout)")
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, check=True)
    own, maxrss = (int(v) for v in out.stdout.split())
    assert own < 300 * 2**20 < 600 * 2**20 <= maxrss, (own, maxrss)
