"""``ooc bench scale``: the pipeline runner (fast checks) and its ~10 M-edge variant (slow)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ooc.tools.bench_scale import ScaleConfig, format_table, kill_at_step, run_scale, run_stage


def test_run_stage_measures_rss_and_exit_code(tmp_path: Path) -> None:
    """Peak RSS shows the child's 200 MB allocation (``ru_maxrss`` also counts the parent's pages
    between fork and exec, so only the lower bound is exact), a failure keeps its exit code."""
    r = run_stage([sys.executable, "-c", "b = bytearray(200 << 20); b[::4096] = b'x' * len(b[::4096])"],
                  tmp_path / "a.log", poll_s=0.05)
    assert r["returncode"] == 0 and r["peak_rss_bytes"] >= 200 << 20
    assert r["seconds"] > 0 and r["system_swaps"] >= 0
    bad = run_stage([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], tmp_path / "b.log")
    assert bad["returncode"] == 3 and "boom" in (tmp_path / "b.log").read_text()


def test_kill_at_step_kills_after_the_asked_records(tmp_path: Path) -> None:
    """A child that appends one record every 20 ms is SIGKILLed once 5 are there (and not before);
    a child that ends first keeps its own exit code."""
    steps = tmp_path / "steps.jsonl"
    writer = ("import sys, time\n"
              "for i in range(10**6):\n"
              "    open(sys.argv[1], 'a').write('{\"step\": %d}\\n' % i); time.sleep(0.02)")
    r = kill_at_step([sys.executable, "-c", writer, str(steps)], steps, 5, tmp_path / "k.log", poll_s=0.01)
    assert r["returncode"] == -9 and r["killed_after_steps"] >= 5
    n = len(steps.read_text().splitlines())
    assert 5 <= n < 200  # killed soon after, not at the end of the million
    quick = kill_at_step([sys.executable, "-c", "import sys; sys.exit(4)"], tmp_path / "none.jsonl", 5,
                         tmp_path / "q.log")
    assert quick["returncode"] == 4 and quick["killed_after_steps"] == 0


def test_small_config_and_table() -> None:
    s = ScaleConfig.small()
    assert (s.nodes, s.edges, s.parts, s.modes) == (500_000, 10_000_000, 16,
                                                   ("hybrid", "buffer", "exact", "auto"))
    full = ScaleConfig()
    assert full.edges >= 10**9 and full.nodes >= 50_000_000 and full.classes >= 20
    assert full.nodes * full.splits[0] >= 500_000 and full.nodes * full.splits[2] >= 100_000
    rec = {"stages": {"generate": {"seconds": 12.5, "peak_rss_bytes": 2**30, "read_bytes": 0,
                                   "swaps": 0, "returncode": 0, "dataset_bytes": 3 * 2**30,
                                   "edges_per_s": 2e6},
                      "train-hybrid": {"seconds": 100.0, "peak_rss_bytes": 2**31, "read_bytes": 2**30,
                                       "returncode": 0, "train_time_s": 80.0, "eval_time_s": 10.0,
                                       "seeds_per_s": 500.0, "edges_per_s": 1e6, "stall_fraction": 0.25,
                                       "buffer_hit_ratio": 0.5, "cache_hit_ratio": 0.1, "swaps": 7,
                                       "test_acc": 0.5}}}
    t = format_table(rec).splitlines()
    assert t[1].split()[:4] == ["generate", "12.5", "1.00", "0.00"] and "2.00 M edges/s" in t[1]
    assert t[2].split()[:4] == ["train-hybrid", "100.0", "2.00", "1.00"]
    assert "swaps 7" in t[2] and "test 0.5000" in t[2] and "stall 0.25" in t[2]


@pytest.mark.slow
def test_small_pipeline_end_to_end(tmp_path: Path) -> None:
    """The ~10 M-edge variant of the billion-edge run (minutes on 2 cores): every stage finishes,
    the graph has the asked size, the planted labels are learnt in every mode."""
    rec = run_scale(ScaleConfig.small(), tmp_path, drop=False, keep=False,
                    kill_resume=("buffer", 20, 8))
    st = rec["stages"]
    assert list(st) == ["generate", "partition", "train-hybrid", "train-buffer", "train-exact",
                        "train-auto", "resume-buffer"]
    assert all(r["returncode"] == 0 for r in st.values())
    assert st["generate"]["num_edges"] == 10_000_000 and st["generate"]["num_nodes"] == 500_000
    assert st["partition"]["partitioning"]["num_parts"] == 16
    for m in ("hybrid", "buffer", "exact", "auto"):
        r = st[f"train-{m}"]
        assert r["test_acc"] > 2 / 20, (m, r["test_acc"])  # 20 classes: chance 0.05
        assert r["peak_rss_bytes"] < 4 << 30
    assert st["train-hybrid"]["resident_partitions"] < 16
    # the automatic split under 600MB: a plan within the budget, its choice and prediction recorded
    auto = st["train-auto"]
    assert auto["budget"]["planned"] <= 600_000_000 and auto["topology"] in ("memory", "disk")
    assert auto["split"]["predicted_bytes"] > 0 and len(auto["split"]["candidates"]) >= 2
    assert json.loads((tmp_path / "scale.json").read_text())["stages"].keys() == st.keys()
    # SIGKILL mid-epoch + --resume ends bit-identical to the uninterrupted buffer run
    kr = st["resume-buffer"]
    assert kr["kill"]["returncode"] == -9 and kr["kill"]["killed_after_steps"] >= 20
    assert kr["compare"]["identical_weights"] and kr["compare"]["identical_losses"]
    assert kr["test_acc"] == st["train-buffer"]["test_acc"]


def test_auto_stage_trains_hybrid_with_the_automatic_split(tmp_path: Path) -> None:
    from ooc.tools.bench_scale import _train_cmd
    cfg = ScaleConfig.small()
    cmd = _train_cmd(cfg, tmp_path / "DS", "auto", tmp_path / "run")
    i = cmd.index("--mode")
    assert cmd[i + 1] == "hybrid"
    assert cmd[cmd.index("--topology") + 1] == "auto"
    assert cmd[cmd.index("--memory-budget") + 1] == "600MB"
    assert "auto" in cfg.modes


def test_papers100m_config_has_the_datasets_shape() -> None:
    p = ScaleConfig.papers100m()
    assert (p.nodes, p.edges, p.feat_dim, p.classes) == (111_059_956, 1_615_685_872, 128, 172)
    assert [round(f * p.nodes) for f in p.splits] == [1_207_179, 125_265, 214_338]
    # the CSC build's degree arrays (20 B/node) must fit the generation budget
    from ooc.util.sizes import parse_bytes
    assert parse_bytes(p.gen_budget) > 20 * p.nodes and p.checkpoint_every > 0


def test_stages_of_another_configuration_kept_only_where_their_fields_agree() -> None:
    from dataclasses import asdict, replace

    from ooc.tools.bench_scale import _stages_still_valid
    cfg = ScaleConfig.small()
    done = {"returncode": 0}
    old = {"config": asdict(cfg), "stages": {"generate": done, "partition": done,
                                             "train-hybrid": done}}
    assert _stages_still_valid(old, asdict(cfg)).keys() == {"generate", "partition", "train-hybrid"}
    assert _stages_still_valid(old, asdict(replace(cfg, budget="1GB"))).keys() == {
        "generate", "partition"}
    assert _stages_still_valid(old, asdict(replace(cfg, parts=8))).keys() == {"generate"}
    assert _stages_still_valid(old, asdict(replace(cfg, edges=10))) == {}
    old["stages"]["compress"] = done  # compress depends on the partitions and its M
    assert _stages_still_valid(old, asdict(replace(cfg, budget="1GB"))).keys() == {
        "generate", "partition", "compress"}
    assert _stages_still_valid(old, asdict(replace(cfg, compress_subspaces=8))).keys() == {
        "generate", "partition"}


def test_compress_stage_writes_codes_the_auto_split_trains_with(tmp_path: Path) -> None:
    """``compress_subspaces`` adds a ``compress`` stage between partition and training: the
    dataset gets M-byte codes (recorded), and a hybrid run forced onto them reads the outer hop's
    misses from the codes; a configuration without the stage refuses ``--stages compress``."""
    cfg = ScaleConfig(nodes=3000, edges=30_000, feat_dim=8, classes=4, splits=(0.5, 0.1, 0.1),
                      parts=4, budget="", buffer_parts=2, fanouts="4,4", eval_fanouts="4,4",
                      batch_size=100, hidden=8, modes=("hybrid",), topology="memory",
                      compress_subspaces=4, extra_train_args=["--miss-features", "pq"])
    rec = run_scale(cfg, tmp_path, drop=False)
    st = rec["stages"]
    assert list(st) == ["generate", "partition", "compress", "train-hybrid"]
    assert st["compress"]["returncode"] == 0 and st["compress"]["pq"]["bytes_per_node"] == 4
    assert "compress" in format_table(rec)
    assert st["train-hybrid"]["returncode"] == 0
    assert st["train-hybrid"]["miss_features"] == "pq"
    assert st["train-hybrid"]["test_acc"] > 0.25  # 4 planted classes: chance 0.25


def test_interrupted_training_stage_resumes_from_its_checkpoint(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The orchestrator dies while a training stage runs (here: its child is SIGKILLed after 3
    steps and the orchestrator stops); run again, the stage continues with ``--resume`` and
    records both segments, and the run ends with every step's loss."""
    from dataclasses import asdict

    import ooc.tools.bench_scale as bs
    from ooc.ingest.generate import generate_rmat
    from ooc.partition import partition_dataset
    cfg = ScaleConfig(nodes=3000, edges=30_000, feat_dim=8, classes=4, splits=(0.5, 0.1, 0.1),
                      parts=4, budget="", buffer_parts=2, fanouts="4,4", eval_fanouts="4,4",
                      batch_size=100, hidden=8, modes=("hybrid",), topology="memory",
                      checkpoint_every=2)
    generate_rmat(tmp_path / "DS", cfg.nodes, cfg.edges, feat_dim=cfg.feat_dim,
                  num_classes=cfg.classes, splits=cfg.splits, feat_dtype=cfg.feat_dtype)
    partition_dataset(tmp_path / "DS", cfg.parts, "stream")
    done = {"returncode": 0, "seconds": 1.0}
    (tmp_path / "scale.json").write_text(json.dumps(
        {"config": asdict(cfg), "stages": {"generate": done, "partition": done}}))
    real = bs.run_stage

    def dies_mid_stage(cmd: list[str], log_path: Path, **kw: object) -> dict:
        kill_at_step(cmd, tmp_path / "runs" / "hybrid" / "steps.jsonl", 3, log_path, poll_s=0.05)
        raise KeyboardInterrupt  # the orchestrator is gone too

    monkeypatch.setattr(bs, "run_stage", dies_mid_stage)
    with pytest.raises(KeyboardInterrupt):
        run_scale(cfg, tmp_path, drop=False)
    marker = json.loads((tmp_path / "scale.json").read_text())["stages"]["train-hybrid"]
    assert marker["returncode"] is None and marker["started_unix"] > 0
    assert (tmp_path / "runs" / "hybrid" / "checkpoint.pt").exists()
    # the first resume fails (e.g. the run is still locked): recorded, and resumed again next time
    monkeypatch.setattr(bs, "run_stage", lambda cmd, log_path, **kw: {
        "command": " ".join(cmd), "seconds": 0.5, "peak_rss_bytes": 1, "read_bytes": 0,
        "system_swaps": 0, "returncode": 2})
    with pytest.raises(RuntimeError, match=r"train-hybrid-resume1\.log \(run the same command again"):
        run_scale(cfg, tmp_path, drop=False)
    monkeypatch.setattr(bs, "run_stage", real)
    rec = run_scale(cfg, tmp_path, drop=False)
    st = rec["stages"]["train-hybrid"]
    assert st["returncode"] == 0, (tmp_path / "logs" / "train-hybrid-resume2.log").read_text()
    segs = st["segments"]
    assert [s.get("interrupted", False) for s in segs] == [True, False, False]
    assert [s["returncode"] for s in segs[1:]] == [2, 0]
    assert segs[0]["steps_seen"] >= 3 and "--resume" in segs[2]["command"]
    assert st["seconds"] == pytest.approx(sum(s["seconds"] for s in segs))
    steps = [json.loads(x) for x in
             (tmp_path / "runs" / "hybrid" / "steps.jsonl").read_text().splitlines() if x.strip()]
    assert [s["step"] for s in steps] == list(range(st["steps"])), steps  # each step once
    assert st["test_acc"] > 0.25  # 4 planted classes: chance 0.25


def test_run_stage_samples_the_disk_footprint(tmp_path: Path) -> None:
    """A stage that writes 3 MB into the dataset's hidden sibling and deletes 2 MB of it: the peak
    is sampled while it runs (start 1 MB, peak >= 4 MB, end 2 MB)."""
    ds = tmp_path / "DS"
    ds.mkdir()
    (ds / "a").write_bytes(b"x" * 1_000_000)
    code = ("import os, time; p = os.path.join(%r, '.DS.partial-1'); os.mkdir(p); "
            "open(os.path.join(p, 'b'), 'wb').write(b'y' * 3_000_000); time.sleep(1.0); "
            "os.truncate(os.path.join(p, 'b'), 1_000_000); time.sleep(0.3)") % str(tmp_path)
    r = run_stage([sys.executable, "-c", code], tmp_path / "log", poll_s=0.05, disk=ds,
                  disk_every_s=0.1)
    assert r["returncode"] == 0
    assert r["disk_start_bytes"] == 1_000_000 and r["disk_end_bytes"] == 2_000_000
    assert r["disk_peak_bytes"] == 4_000_000
    rec = {"stages": {"partition": dict(r, dataset_bytes=2_000_000),
                      "train-auto": {"date": "d", "started_unix": 1.0, "returncode": None}}}
    t = format_table(rec).splitlines()
    assert "(2.00x the result)" in t[1] and "not finished (run again to resume)" in t[2]


def test_bench_scale_refuses_bad_options_before_any_stage(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    from ooc.tools.cli import main
    for extra, words in ((["--modes", "bogus"], "bogus is not one of hybrid, buffer, exact, auto"),
                         (["--checkpoint-every", "-3"], "steps must be >= 0"),
                         (["--stages", "foo"], "foo is not a stage of this run")):
        assert main(["bench", "scale", "--small", "--workdir", str(tmp_path / "w"), *extra]) == 2
        assert words in capsys.readouterr().err
    assert not (tmp_path / "w" / "DS").exists()
