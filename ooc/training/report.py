"""``ooc report RUN [RUN...]``: curves, I/O-stall timelines and a summary table of training runs.

Inputs per run directory (written by :func:`ooc.training.loop.train`): ``metrics.json`` (summary),
``metrics.jsonl`` (one record per epoch) and ``steps.jsonl`` (one record per step).  A directory of an
``ooc train --repeat N`` (``summary.json`` + ``seedK/`` runs) is one *group*: its curves are drawn as
the mean over seeds with a +-1 std band and its table row gives mean +- std.

Outputs in ``--out``:

- ``curves.png`` -- training loss and train / validation / test score per epoch, runs side by side;
- ``io.png`` -- per run, the time line of every step split into I/O stall (waiting for the loader:
  sampling, partition loads, feature reads) and compute, with epoch boundaries, and the per-epoch
  buffer hit ratio;
- ``summary.md`` -- the printed table.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ooc.util.files import read_jsonl
from ooc.util.sizes import format_bytes as _human

__all__ = ["RunData", "load_runs", "summary_table", "plot_curves", "plot_io", "make_report"]


@dataclass
class RunData:
    """One run (or a group of seeds) as read from disk."""

    name: str
    path: Path
    metrics: dict
    epochs: list[dict]
    steps: list[dict]
    members: list["RunData"] = field(default_factory=list)   # seeds of a --repeat group

    @property
    def is_group(self) -> bool:
        return bool(self.members)

    @property
    def task(self) -> str:
        return self.metrics.get("task", "node")

    @property
    def score_keys(self) -> tuple[str, str]:
        return ("val_mrr", "test_mrr") if self.task == "link" else ("val_acc", "test_acc")




def _load_one(path: Path, name: str | None = None) -> RunData:
    mfile = path / "metrics.json"
    if not mfile.exists():
        raise FileNotFoundError(f"{path}: no metrics.json (not a finished ooc run)")
    metrics = json.loads(mfile.read_text())
    epochs = read_jsonl(path / "metrics.jsonl") or metrics.get("history", [])
    return RunData(name or path.name, path, metrics, epochs, read_jsonl(path / "steps.jsonl"))


def load_runs(paths: list[str | Path]) -> list[RunData]:
    """Read runs; a ``--repeat`` directory (``summary.json``) becomes a group of its seeds.

    Raises:
        FileNotFoundError: a path is neither a run nor a repeat directory.
    """
    runs = []
    for p in map(Path, paths):
        if (p / "summary.json").exists() and not (p / "metrics.json").exists():
            summ = json.loads((p / "summary.json").read_text())
            members = [_load_one(Path(r)) if Path(r).exists() else _load_one(p / Path(r).name)
                       for r in summ.get("runs", [])] or \
                [_load_one(d) for d in sorted(p.glob("seed*")) if (d / "metrics.json").exists()]
            if not members:
                raise FileNotFoundError(f"{p}: summary.json lists no readable runs")
            runs.append(RunData(p.name, p, members[0].metrics, members[0].epochs, [], members))
        else:
            runs.append(_load_one(p))
    return runs




def _pm(vals: list[float], pct: bool = True) -> str:
    f = 100.0 if pct else 1.0
    if len(vals) == 1:
        return f"{f * vals[0]:.2f}"
    return f"{f * float(np.mean(vals)):.2f} ± {f * float(np.std(vals)):.2f}"


def _row(r: RunData) -> list[str]:
    members = r.members or [r]
    vk, tk = r.score_keys
    cfg = r.metrics.get("config", {})
    ep_times = [t for m in members for t in m.metrics.get("epoch_time_s", [])]
    shares = [_stall_share(m.steps) for m in members if m.steps]
    seeds_s = [e["seeds_per_s"] for m in members for e in m.epochs if "seeds_per_s" in e]
    return [
        r.name + (f" ({len(members)} seeds)" if r.is_group else ""),
        f"{cfg.get('model', '?')}/{r.task}",
        str(round(float(np.mean([m.metrics.get("epochs_run", len(m.epochs)) for m in members])))),
        str(r.metrics.get("best_epoch", "")) if not r.is_group else
        f"{np.mean([m.metrics.get('best_epoch', 0) for m in members]):.0f}",
        _pm([m.metrics[vk] for m in members if vk in m.metrics]),
        _pm([m.metrics[tk] for m in members if tk in m.metrics]),
        f"{np.mean(ep_times):.2f}" if ep_times else "-",
        f"{np.mean(seeds_s):,.0f}" if seeds_s else "-",
        f"{100 * float(np.mean(shares)):.1f}%" if shares else "-",
        _human(float(np.mean([m.metrics.get("bytes_read", 0) for m in members]))),
        f"{np.mean([m.metrics.get('buffer_hit_ratio', 0) for m in members]):.3f}",
        _human(float(np.max([m.metrics.get("peak_rss_bytes", 0) for m in members]))),
    ]


HEADER = ["run", "model/task", "epochs", "best", "val", "test", "s/epoch", "seeds/s", "stall",
          "read", "hit", "peak RSS"]


def summary_table(runs: list[RunData]) -> str:
    """A Markdown table, one row per run or group (val/test in %, MRR for link prediction)."""
    rows = [HEADER] + [_row(r) for r in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _series(r: RunData, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(epochs, mean, std) of ``key`` over the run's (or group's) epoch records."""
    members = r.members or [r]
    per: dict[int, list[float]] = {}
    for m in members:
        for e in m.epochs:
            v = e.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                per.setdefault(int(e["epoch"]), []).append(float(v))
    if not per:
        return None
    xs = np.array(sorted(per))
    return xs, np.array([np.mean(per[x]) for x in xs]), np.array([np.std(per[x]) for x in xs])


def _plt():  # type: ignore[no-untyped-def]
    try:
        import matplotlib
    except ImportError:  # pragma: no cover
        raise ImportError("ooc report needs matplotlib (pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_curves(runs: list[RunData], out: Path) -> Path:
    """``curves.png``: loss (left) and scores (right) per epoch; groups as mean +- std."""
    plt = _plt()
    fig, (ax_l, ax_s) = plt.subplots(1, 2, figsize=(13, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, r in enumerate(runs):
        c = colors[i % len(colors)]
        s = _series(r, "loss")
        if s is not None:
            ax_l.plot(s[0], s[1], color=c, label=r.name)
            if r.is_group:
                ax_l.fill_between(s[0], s[1] - s[2], s[1] + s[2], color=c, alpha=0.2)
        vk, tk = r.score_keys
        for key, style in (("train_acc", ":"), (vk, "-"), (tk, "--")):
            s = _series(r, key)
            if s is None:
                continue
            ax_s.plot(s[0], s[1], style, color=c, label=f"{r.name} {key}")
            if r.is_group:
                ax_s.fill_between(s[0], s[1] - s[2], s[1] + s[2], color=c, alpha=0.12)
    ax_l.set(xlabel="epoch", ylabel="training loss", title="loss")
    ax_l.set_yscale("log")
    ax_s.set(xlabel="epoch", ylabel="score (accuracy / micro-F1 / MRR)",
             title="train (dotted), validation (solid), test (dashed)")
    for ax in (ax_l, ax_s):
        ax.grid(alpha=0.3)
    ax_l.legend(fontsize=8)
    ax_s.legend(fontsize=7, ncol=max(1, len(runs) // 4))
    fig.tight_layout()
    path = out / "curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _stall_share(steps: list[dict]) -> float:
    """Fraction of step time spent waiting for batches, without the first step (JIT warm-up)."""
    st = steps[1:] if len(steps) > 1 else steps
    stall = sum(s["stall_s"] for s in st)
    busy = stall + sum(s["compute_s"] for s in st)
    return stall / busy if busy > 0 else 0.0


def plot_io(runs: list[RunData], out: Path) -> Path:
    """``io.png``: per run, the per-step time line of I/O stall vs compute and the hit ratio.

    Each step is drawn at its wall-clock time (``t`` in ``steps.jsonl``), stall below compute, epoch by
    epoch (gaps are evaluation); the y range ignores the first step, whose stall is JIT compilation.
    """
    plt = _plt()
    flat = [(f"{r.name}/{r.members[0].name}", r.members[0]) if r.is_group else (r.name, r) for r in runs]
    fig, axes = plt.subplots(len(flat), 1, figsize=(13, 2.7 * len(flat) + 0.6), squeeze=False)
    for ax, (name, r) in zip(axes[:, 0], flat):
        st = r.steps
        if not st:
            ax.text(0.5, 0.5, f"{name}: no steps.jsonl", ha="center", transform=ax.transAxes)
            continue
        by_epoch: dict[int, list[dict]] = {}
        for s in st:
            by_epoch.setdefault(int(s["epoch"]), []).append(s)
        for k, (e, ss) in enumerate(sorted(by_epoch.items())):
            t = np.array([s["t"] for s in ss])
            stall = np.array([s["stall_s"] for s in ss]) * 1e3
            comp = np.array([s["compute_s"] for s in ss]) * 1e3
            ax.fill_between(t, 0, stall, step="pre", color="tab:red", alpha=0.75,
                            label="stall: waiting for the loader (I/O, sampling)" if k == 0 else None)
            ax.fill_between(t, stall, stall + comp, step="pre", color="tab:blue", alpha=0.35,
                            label="compute: forward, backward, step" if k == 0 else None)
            if k:
                ax.axvline(t[0] - (stall[0] + comp[0]) / 1e3, color="grey", lw=0.6, alpha=0.5)
        per_step = np.array([(s["stall_s"] + s["compute_s"]) * 1e3 for s in st[1:]] or [1.0])
        ax.set_ylim(0, 1.15 * float(np.percentile(per_step, 99.5)) + 1e-3)
        first = (st[0]["stall_s"] + st[0]["compute_s"])
        ax.set(ylabel="ms per step",
               title=f"{name}: {len(st)} steps, stall {100 * _stall_share(st):.1f}% of step time "
                     f"(first step {first:.2f} s incl. JIT, clipped), "
                     f"{_human(r.metrics.get('bytes_read', 0))} read")
        ax.grid(alpha=0.3)
        ends = {int(s["epoch"]): s["t"] for s in st}
        hits = [(ends[int(e["epoch"])], e["buffer_hit_ratio"]) for e in r.epochs
                if "buffer_hit_ratio" in e and int(e["epoch"]) in ends]
        h1, l1 = ax.get_legend_handles_labels()
        if hits:
            ax2 = ax.twinx()
            ax2.plot([h[0] for h in hits], [h[1] for h in hits], "o-", color="tab:green", ms=3, lw=1,
                     label="buffer hit ratio (per epoch)")
            ax2.set_ylim(0, 1.05)
            ax2.set_ylabel("hit ratio")
            h2, l2 = ax2.get_legend_handles_labels()
            h1, l1 = h1 + h2, l1 + l2
        ax.legend(h1, l1, fontsize=8, loc="upper left", framealpha=0.85)
    axes[-1, 0].set_xlabel("wall time since the start of the run (s); grey lines: epoch starts, gaps: "
                           "evaluation")
    fig.tight_layout()
    path = out / "io.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def make_report(paths: list[str | Path], out: str | Path, plots: bool = True) -> tuple[str, list[Path]]:
    """Load runs, write ``summary.md`` and (unless ``plots=False``) ``curves.png`` / ``io.png``.

    Returns:
        ``(table, written files)``.
    """
    runs = load_runs(paths)
    outd = Path(out)
    outd.mkdir(parents=True, exist_ok=True)
    table = summary_table(runs)
    written = [outd / "summary.md"]
    written[0].write_text(table + "\n")
    if plots:
        written += [plot_curves(runs, outd), plot_io(runs, outd)]
    return table, written
