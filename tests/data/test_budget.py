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
