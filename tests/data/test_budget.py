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


def test_exact_read_ahead_depth_weighs_fewer_window_reads_against_building_on_the_trainer() -> None:
    """Each window costs about one pass over the features; building no batch ahead costs each
    batch's rows gathered on the trainer's thread.  The cheapest depth wins (ties: the deepest),
    with windows of near-equal width."""
    from ooc.data.budget import DISK_BYTES_PER_S, STAGED_GATHER_BYTES_PER_S, _read_ahead_depth
    feat = int(DISK_BYTES_PER_S)  # one second per window read
    small = int(STAGED_GATHER_BYTES_PER_S) // 1000  # 1 ms per batch built on the trainer
    # 79 steps: depth 2 reads 8 windows, depth 0 reads 6 (+ 79 ms): depth 0, windows of 14
    assert _read_ahead_depth({2: 10, 1: 11, 0: 14}, 79, feat, small) == (0, 14)
    # the same number of reads (8): the deepest, at the narrowest width reading 8 times
    assert _read_ahead_depth({2: 10, 1: 11, 0: 11}, 79, feat, small) == (2, 10)
    # one read fewer does not pay for building 79 batches at 20 ms on the trainer (1.58 s)
    assert _read_ahead_depth({2: 10, 1: 10, 0: 12}, 79, feat, 20 * small) == (2, 10)
    # depth 1 reads fewer windows than depth 2 at no building cost
    assert _read_ahead_depth({2: 10, 1: 12, 0: 12}, 79, feat, small) == (1, 12)
    # a window only beside fewer batches built ahead; none at all
    assert _read_ahead_depth({2: 0, 1: 0, 0: 5}, 79, feat, small) == (0, 5)
    assert _read_ahead_depth({2: 0, 1: 0, 0: 0}, 79, feat, small) == (2, 0)
    # steps not known: widths compared as 1 / width; the widest at depth 1 beats depth 2's
    assert _read_ahead_depth({2: 10, 1: 20, 0: 20}, 0, feat, small) == (1, 20)
