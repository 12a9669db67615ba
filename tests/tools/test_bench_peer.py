"""``ooc bench peer``'s runs: every ``--modes`` entry becomes the ``ooc train`` flags its name says,
and ``ooc train`` accepts them."""

from __future__ import annotations

import pytest

from ooc.tools.bench_peer import PEER_MODES, _NAMES, _mode_args
from ooc.tools.cli import build_parser


@pytest.mark.parametrize("mode", PEER_MODES)
def test_every_mode_is_a_train_command_line_with_a_name(mode: str) -> None:
    args = _mode_args(mode, 400_000_000)
    ns = build_parser().parse_args(["train", "DS", *args])
    assert ns.mode == ("exact" if mode.startswith("exact") else "hybrid")
    assert mode in _NAMES
    want = {"hybrid-pq": ["--miss-features", "pq"], "hybrid-pq-auto": ["--miss-features", "auto"],
            "exact-cache": ["--read-ahead", "0"],
            "exact-belady": ["--cache-policy", "belady"], "hybrid-serial": ["--sample-ahead", "0"],
            "exact-serial": ["--sample-ahead", "0"], "hybrid-layerwise": ["--eval-mode", "layerwise"],
            "exact-layerwise": ["--eval-mode", "layerwise"], "hybrid-sampled": ["--eval-mode", "sampled"],
            "exact-sampled": ["--eval-mode", "sampled"]}.get(mode, [])
    pos = [i for i in range(len(args)) if args[i:i + len(want)] == want] if want else [0]
    assert pos, (mode, args)
    assert ("--sample-ahead" in args) == mode.endswith("-serial")
    budget = args[args.index("--memory-budget") + 1]
    assert budget == (str(64 << 30) if mode == "resident" else "400000000")


def test_a_hybrid_mode_with_a_mix_adds_its_hybrid_mix() -> None:
    from ooc.tools.bench_ooc import check_modes
    args = _mode_args("hybrid-pq:0.1", 400_000_000)
    assert args[-2:] == ["--hybrid-mix", "0.1"] and "--miss-features" in args
    ns = build_parser().parse_args(["train", "DS", *args])
    assert ns.hybrid_mix == 0.1 and ns.miss_features == "pq"
    check_modes(["resident", "hybrid:0", "exact-cache"], PEER_MODES)
    for bad in ("exact:0.1", "hybrid:1.5", "hybrid:x", "nope"):
        with pytest.raises(ValueError, match="--modes entry"):
            check_modes([bad], PEER_MODES)
    with pytest.raises(ValueError, match="'hybrid:0.1' is listed twice"):
        check_modes(["hybrid:0.1", "resident", "hybrid:0.1"], PEER_MODES)


def test_a_failed_run_exits_1_with_its_command_and_no_traceback(monkeypatch, capsys) -> None:
    import ooc.tools.bench_peer as bench_peer
    ns = build_parser().parse_args(["bench", "peer", "DS", "--no-drop-caches"])

    def fail(a):
        raise RuntimeError("python -m ooc.tools.cli train DS failed:\nooc train: error: budget")
    monkeypatch.setattr(bench_peer, "run_bench_peer", fail)
    assert bench_peer._cmd(ns) == 1
    err = capsys.readouterr().err
    assert err.startswith("ooc bench peer: python -m ooc.tools.cli train DS failed")
    assert "ooc train: error: budget" in err and "Traceback" not in err
